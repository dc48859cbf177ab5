import { frozenDrills } from './frozen.drills.js';
import { postgresDrillTarget } from './postgres-target.js';

frozenDrills(postgresDrillTarget);
