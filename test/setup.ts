// Every test worker: hide kafkajs 2.2.4's harmless TimeoutNegativeWarning on Node 24.
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";

hideKafkajsTimeoutWarning();
