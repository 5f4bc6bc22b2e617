// Reading markdown the way GitHub renders it: what the docs tests check links, anchors and § references against.

/** Markdown without its fenced code blocks (headings and links inside them are not headings or links). */
export function prose(markdown: string): string {
  return markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "");
}

/** Numbered sections of a markdown file: `## 3. Pipeline` → "3", `### 3.2 Classify` → "3.2". */
export function sections(markdown: string): Set<string> {
  return new Set([...prose(markdown).matchAll(/^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s/gm)].map((m) => m[1]!));
}

/** GitHub's heading anchors (github-slugger): lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
export function anchors(markdown: string): Set<string> {
  const out = new Set<string>();
  const seen = new Map<string, number>();
  for (const m of prose(markdown).matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const text = m[1]!.replace(/\[([^\]]*)\]\([^)]*\)/g, "$1");
    const base = text.toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "").replace(/ /g, "-");
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}
