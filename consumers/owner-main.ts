// The owner process: `npm run owner` (`-- --tools <module>`, or WRIT_TOOLS_MODULE).
// The same code as `writ owner` (src/cli/owner.ts); configuration comes from
// the environment (see the README) and is validated before anything connects.
import { exitWhenWritten } from "../src/cli/exit.ts";
import { ownerCommand } from "../src/cli/owner.ts";
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";

hideKafkajsTimeoutWarning();
process.env.KAFKAJS_NO_PARTITIONER_WARNING ??= "1";
const code = await ownerCommand.main(process.argv.slice(2));
await exitWhenWritten(code);
