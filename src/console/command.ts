// `writ console`: serves the operator console (src/console/server.ts) until interrupted.
import {
  brokersFrom,
  clientSettingsFromEnv,
  commandLogger,
  connectionFor,
  contractTopicsFromEnv,
  groupIdFromEnv,
  intFlag,
  msFlag,
  ownerPrincipalsFrom,
  parseCommandArgs,
  registryFrom,
  replyPrefixFromEnv,
  runCommand,
  signingFromFlags,
  UsageError,
  type Command,
} from "../cli/common.ts";
import { onStopSignals } from "../cli/signals.ts";
import { jsonLine, printable } from "../printable.ts";
import { DEFAULT_HEADERS_TIMEOUT_MS, listenFault, probeListen } from "../listen.ts";
import { CONSOLE_MAX_CONNECTIONS, startConsole, type ConsoleOptions } from "./server.ts";
import { badAllowedHost, ConsoleAuth } from "./auth.ts";

const USAGE = `usage: writ console [--token <token>] [--operator-token <token>] [--operator <id>] [--host <addr>] [--port <n>]

The operator console: a web page following writ's topics live (server-sent events): intents in flight,
replies by status, conflicts (current beside your_change), escalations (open and resolved), dead letters,
and the owners' lag per intents partition, with filters by agent, tool and record. With the operator
role, escalations are resolved from the page: apply on the record's version (or another base), with
the change to write as a JSON Patch for a tool without a delta function (as --delta), discard,
or return to the agent with a message; the record's owner carries the decision out and the agent gets
it on its reply topic (as writ escalations resolve), and dead letters are sent back to the intents topic
once their cause is fixed, one, the ones ticked or every one shown (as writ dlq redrive --source, --reason). Reads committed
records only, skips control records, decodes plain JSON and the Confluent wire format.

Open http://<host>:<port>/#token=<token> (a fragment: no browser sends it, so it reaches no log): the page keeps
the token for its tab and removes it from the address. A read-only token sees everything and cannot resolve
or send back (403); the operator token can.

  --token <token>           the read-only token, at least 16 characters (default $WRIT_CONSOLE_TOKEN;
                            required). Prefer the variables: a flag's value is visible in the process list.
  --operator-token <token>  the operator token, another one (default $WRIT_CONSOLE_OPERATOR_TOKEN);
                            without it the console is read-only
  --operator <id>           the agent id decisions are sent as (default writ-operator). Where owners run with
                            an agent registry it must be allowed "writ.resolve" and sign with its key:
  --signing-key <pem file>  the operator's Ed25519 private key (with --key-id <id>)
  --audience <a>            the deployment its decisions are signed for: the owners' WRIT_SIGNING_AUDIENCE
                            (default $WRIT_SIGNING_AUDIENCE when signing)
  --reply-topic <topic>     the operator's reply topic (default <reply prefix><operator>)
  --host <addr>             address to bind (default 127.0.0.1)
  --port <n>                port (default 39200; 0 takes a free one)
  --allowed-host <name>     another Host name the page is reached by, name[:port] or [IPv6 address][:port]
                            (repeatable), e.g. behind a proxy; other Host and Origin headers are refused (DNS
                            rebinding). On port 80 the bare name is allowed too (browsers leave that port out)
  --backlog <n>             offsets read back per partition of the topics there at the start (default 1000);
                            topics created later are read from their beginning
  --from-beginning          read every topic from its beginning
  --keep <n>                items kept per list: replies, conflicts, dead letters (default 100)
  --discover-ms <ms>        how often to look for new reply topics (default 5000)
  --lag-ms <ms>             how often to measure the lag (default 2000)
  --headers-timeout-ms <ms> close a connection whose request headers take longer than this, from its opening
                            or its request's first byte (default 10000); a request with its body gets 30 s (or
                            this, if longer), an idle keep-alive connection 5 s; event streams are not cut
  --max-connections-per-address <n>
                            open connections from one address at most, of 256 (default: no cap of its own;
                            behind a proxy every page comes from the proxy's address)
  --owner-principal <p>     the owners' Kafka principal(s), User:<name> or a bare SASL user name (repeatable or
                            comma-separated; default $WRIT_OWNER_PRINCIPALS or User:writ-owner), for the ACL check
  --brokers <list>          Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --registry <url>          Confluent-API schema registry (default $SCHEMA_REGISTRY_URL)
  -h, --help                this text

Topics and group as the owners': $WRIT_INTENTS_TOPIC (writ.intents), $WRIT_HUMAN_TOPIC (writ.human),
$WRIT_DLQ_TOPIC (writ.dlq), reply topics $WRIT_REPLY_TOPIC_PREFIX* (writ.replies.*), $WRIT_GROUP_ID (writ.owners).

At the start it checks, as writ doctor does, who may write $WRIT_LEDGER_TOPIC (writ.ledger), writ.human,
writ.dlq and the reply topics: when the cluster has no authorizer, or a principal other than the owners'
(--owner-principal) may write one, it logs a warning and the page shows a banner (records on those topics
may be forged); so it does when no ACL lets the owners write one of writ's topics.

Exit status: 0 stopped (SIGINT, SIGTERM), 2 bad usage or could not start; a second SIGINT or SIGTERM while it
stops, 1 s or more after the first (one sooner is the same request), ends it at once (130, 143).`;

const OPTIONS = {
  token: { type: "string" },
  "operator-token": { type: "string" },
  operator: { type: "string" },
  "signing-key": { type: "string" },
  "key-id": { type: "string" },
  audience: { type: "string" },
  "reply-topic": { type: "string" },
  host: { type: "string" },
  port: { type: "string" },
  "allowed-host": { type: "string", multiple: true },
  backlog: { type: "string" },
  "from-beginning": { type: "boolean" },
  keep: { type: "string" },
  "discover-ms": { type: "string" },
  "lag-ms": { type: "string" },
  "headers-timeout-ms": { type: "string" },
  "max-connections-per-address": { type: "string" },
  brokers: { type: "string" },
  registry: { type: "string" },
  "owner-principal": { type: "string", multiple: true },
} as const;

async function main(argv: string[]): Promise<number> {
  const parsed = parseCommandArgs(argv, OPTIONS, USAGE);
  if (parsed === undefined) return 0;
  const a = parsed.values;
  const token = a.token ?? process.env.WRIT_CONSOLE_TOKEN;
  if (!token) throw new UsageError("the console needs a token: --token or WRIT_CONSOLE_TOKEN (at least 16 characters)");
  const operatorToken = a["operator-token"] ?? (process.env.WRIT_CONSOLE_OPERATOR_TOKEN || undefined);
  if (operatorToken === undefined && (a.operator !== undefined || a["signing-key"] !== undefined || a.audience !== undefined || a["reply-topic"] !== undefined)) {
    throw new UsageError("--operator, --signing-key, --audience and --reply-topic need the operator role: give --operator-token (or WRIT_CONSOLE_OPERATOR_TOKEN)");
  }
  const signing = signingFromFlags(a);
  const port = intFlag("port", a.port, 39200, 0, 65535);
  const brokers = brokersFrom(a.brokers);
  const connection = connectionFor(registryFrom(a.registry));
  const log = commandLogger("console");
  const replyPrefix = replyPrefixFromEnv();
  const operatorId = a.operator ?? "writ-operator";
  const { ledger, ...topics } = contractTopicsFromEnv();
  // A bad one is a config_invalid error naming the flag: runCommand exits 2 with its message.
  const ownerPrincipals = ownerPrincipalsFrom(a["owner-principal"]);
  const host = a.host ?? "127.0.0.1";
  // Every flag is checked before the port is: a bad token or number is named as such even when the port is taken.
  ConsoleAuth.check(token, operatorToken, {
    token: a.token !== undefined ? "--token" : "WRIT_CONSOLE_TOKEN",
    operatorToken: a["operator-token"] !== undefined ? "--operator-token" : "WRIT_CONSOLE_OPERATOR_TOKEN",
  });
  const allowedHosts = a["allowed-host"] ?? [];
  const badHost = badAllowedHost(allowedHosts);
  if (badHost !== null) throw new UsageError(`--allowed-host ${jsonLine(badHost.entry)}: ${badHost.fault}`);
  const settings = {
    allowedHosts,
    backlog: a["from-beginning"] ? ("all" as const) : intFlag("backlog", a.backlog, 1000),
    limits: { recent: intFlag("keep", a.keep, 100, 1) },
    discoverIntervalMs: msFlag("discover-ms", a["discover-ms"], 5000, 100),
    lagIntervalMs: msFlag("lag-ms", a["lag-ms"], 2000, 100),
    headersTimeoutMs: intFlag("headers-timeout-ms", a["headers-timeout-ms"], DEFAULT_HEADERS_TIMEOUT_MS, 1, 3_600_000),
    ...(a["max-connections-per-address"] === undefined ? {} : { maxConnectionsPerAddress: intFlag("max-connections-per-address", a["max-connections-per-address"], CONSOLE_MAX_CONNECTIONS, 1, CONSOLE_MAX_CONNECTIONS) }),
  };
  // Before anything connects: a port in use or a host that is not this machine's, named by its flag, not a bare
  // listen error once the console has read Kafka.
  await probeListen(host, port).catch((err: unknown) => {
    const { setting, reason } = listenFault("the console", host, port, err);
    throw new UsageError(`${setting === "port" ? `--port ${port}` : `--host ${printable(host)}`}: ${reason}`);
  });

  const server = await startConsole({
    brokers,
    connection,
    topics,
    ledgerTopic: ledger,
    ownerPrincipals,
    replyPrefix,
    groupId: groupIdFromEnv(),
    token,
    ...(operatorToken !== undefined ? { operatorToken } : {}),
    operator: {
      id: operatorId,
      settings: clientSettingsFromEnv(),
      ...(a["reply-topic"] ? { replyTopic: a["reply-topic"] } : {}),
      ...signing,
    },
    host,
    port,
    ...settings,
    logger: log,
    onDecision: (d) => {
      process.stderr.write(decisionLine(d));
    },
  });
  try {
    await server.ready;
  } catch (err) {
    await server.close();
    throw err;
  }
  process.stderr.write(
    `writ console: listening on ${server.url}/ (${operatorToken === undefined ? "read-only" : `operator role as ${operatorId}`}); open ${server.url}/#token=<your token>\n`,
  );

  // A second SIGINT or SIGTERM while the console closes (its event streams, its Kafka clients) ends it at once.
  let stopAsked = () => {};
  const stop = new Promise<void>((resolve) => (stopAsked = resolve));
  const signals = onStopSignals(
    () => stopAsked(),
    (signal) => process.stderr.write(`writ console: second signal (${signal}): exiting without a clean stop\n`),
  );
  await stop;
  process.stderr.write("writ console: stopping (again, 1 s on, to quit at once)\n");
  await server.close();
  signals.dispose();
  return 0;
}

export const consoleCommand: Command = {
  usage: USAGE,
  options: OPTIONS,
  main: (argv) => runCommand("console", USAGE, () => main(argv)),
};

/** The operator's decision as the console logs it. The escalation id is the record's (writ.human is read, not trusted). */
export function decisionLine(d: Parameters<NonNullable<ConsoleOptions["onDecision"]>>[0]): string {
  return `writ console: ${printable(`escalation ${d.escalationId}: ${d.decision} by ${d.operator}: ${d.status}${d.reason ? ` ${d.reason}` : ""}`)}\n`;
}
