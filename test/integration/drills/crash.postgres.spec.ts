import { crashDrills } from './crash.drills.js';
import { postgresDrillTarget } from './postgres-target.js';

crashDrills(postgresDrillTarget);
