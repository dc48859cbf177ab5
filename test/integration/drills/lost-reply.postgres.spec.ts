import { lostReplyDrills } from './lost-reply.drills.js';
import { postgresDrillTarget } from './postgres-target.js';

lostReplyDrills(postgresDrillTarget);
