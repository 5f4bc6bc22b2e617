/** `[[[…[]…]]]`: `levels` arrays, each in the next, a JSON value of jsonDepth `levels`; built without recursion. */
export function nested(levels: number): unknown {
  let v: unknown = [];
  for (let i = 1; i < levels; i++) v = [v];
  return v;
}
