/**
 * The activation rule of Service Broker's queue monitor, applied to table-queue readers:
 * a new reader is useful only when there is work it could claim and the readers already
 * running are not keeping up, which shows as none of them having come back empty-handed
 * for a while. Counting rows instead would start readers that only wait (for example on a
 * backlog that belongs to one ordered group).
 */
export interface ActivationInput {
  readers: number;
  minReaders: number;
  maxReaders: number;
  /** Engine clock time of the last claim that returned nothing; null if none yet. */
  lastEmptyClaimAt: number | null;
  now: number;
  /** How long no reader may have come back empty before another one is started. */
  quietMs: number;
  /** Claimable work exists (for ordered queues: a claimable group, not just rows). */
  hasClaimableWork: boolean;
}

export function shouldAddReader(input: ActivationInput): boolean {
  if (input.readers >= input.maxReaders || !input.hasClaimableWork) return false;
  if (input.readers < input.minReaders) return true;
  return input.lastEmptyClaimAt === null || input.now - input.lastEmptyClaimAt >= input.quietMs;
}

/** A reader whose claim came back empty retires while more than the minimum run. */
export function shouldRetireAfterEmptyClaim(readers: number, minReaders: number): boolean {
  return readers > minReaders;
}

/** Whether the activation check needs the database at all (it costs a query). */
export function activationMayAddReader(input: Omit<ActivationInput, 'hasClaimableWork'>): boolean {
  return shouldAddReader({ ...input, hasClaimableWork: true });
}
