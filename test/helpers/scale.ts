import type { ScaleInputs } from '../../lib/src/core/scaling/index.js';

/** A queue with nothing in it and nothing measured: the base the scale tests change one field of. */
export const IDLE_SCALE_INPUTS: ScaleInputs = {
  claimable: 0,
  running: 0,
  completedInWindow: 0,
  busyMsInWindow: 0,
  windowMs: 300_000,
  paused: false,
  globalConcurrency: null,
  rateMax: null,
  ratePerMs: null,
};
