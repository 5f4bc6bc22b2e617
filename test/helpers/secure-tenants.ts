// The tenants of the secure stack (src/testing/secure-stack.ts) that the suites over SASL_SSL share: each its own
// SCRAM users, topics, groups and ACLs. scripts/test.mjs starts the stack with all of them, once, for a full
// `npm test`, and .ci/run keeps it for the Python suite. test/integration/doctor-acls.test.ts uses the stack's own
// users and the README's names, which no tenant touches.
export const SECURE_TENANTS = {
  /** test/integration/secure.test.ts */
  secureTest: "ts-secure",
  /** python/tests/test_secure_stack.py (which names it too) */
  python: "py-secure",
} as const;
