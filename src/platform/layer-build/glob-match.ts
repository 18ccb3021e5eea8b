/** A compiled path glob: `**`, `**\/`, `*`, `?`, `[...]` and `\` escapes, as Docker reads them. */
export interface PathGlob {
  test(path: string): boolean;
}

/** One piece of a glob; `segments` is `**` followed by `/`: nothing, or anything that ends in `/`. */
type Piece =
  | { kind: 'literal'; char: string }
  | { kind: 'one' }
  | { kind: 'star' }
  | { kind: 'any' }
  | { kind: 'segments' }
  | { kind: 'class'; matches: (char: string) => boolean };

function pieces(glob: string): Piece[] {
  const out: Piece[] = [];
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i] ?? '';
    if (c === '*' && glob[i + 1] === '*') {
      const slash = glob[i + 2] === '/';
      out.push({ kind: slash ? 'segments' : 'any' });
      i += slash ? 2 : 1;
    } else if (c === '*') out.push({ kind: 'star' });
    else if (c === '?') out.push({ kind: 'one' });
    else if (c === '[' && glob.indexOf(']', i + 1) > 0) {
      const end = glob.indexOf(']', i + 1);
      // one character against one class: a regular expression that cannot backtrack
      const set = new RegExp(
        `^[${glob
          .slice(i + 1, end)
          .replace(/^!/, '^')
          .replace(/\\/g, '\\\\')}]$`,
      );
      out.push({ kind: 'class', matches: (char) => set.test(char) });
      i = end;
    } else if (c === '\\' && i + 1 < glob.length) out.push({ kind: 'literal', char: glob[++i] ?? '' });
    else out.push({ kind: 'literal', char: c });
  }
  return out;
}

/**
 * Compiles a glob into a matcher that walks the path once, keeping the set of places in the
 * pattern it may be at (a Thompson simulation): time grows with path × pattern, never
 * exponentially, so a task's `.dockerignore` of `**a**a**a…` cannot stall the node the way a
 * backtracking regular expression did. State 2k is "at piece k"; 2k+1 is "inside piece k's `**\/`".
 */
export function compileGlob(glob: string): PathGlob {
  const parts = pieces(glob);
  const end = 2 * parts.length;
  /** Adds `state` and every state it reaches without a character. */
  const close = (states: Set<number>, state: number): void => {
    if (states.has(state)) return;
    states.add(state);
    const index = state >> 1;
    const piece = parts[index];
    // star, any and segments may match nothing (segments only before it has taken a character)
    if (
      state % 2 === 0 &&
      piece &&
      piece.kind !== 'literal' &&
      piece.kind !== 'one' &&
      piece.kind !== 'class'
    )
      close(states, 2 * (index + 1));
  };
  return {
    test(path: string): boolean {
      let states = new Set<number>();
      close(states, 0);
      for (const char of path) {
        const next = new Set<number>();
        for (const state of states) {
          const index = state >> 1;
          const piece = parts[index];
          if (!piece) continue;
          const after = 2 * (index + 1);
          switch (piece.kind) {
            case 'literal':
              if (char === piece.char) close(next, after);
              break;
            case 'one':
              if (char !== '/') close(next, after);
              break;
            case 'class':
              if (piece.matches(char)) close(next, after);
              break;
            case 'star':
              if (char !== '/') close(next, state);
              break;
            case 'any':
              close(next, state);
              break;
            case 'segments':
              close(next, 2 * index + 1);
              if (char === '/') close(next, after);
              break;
          }
        }
        states = next;
        if (states.size === 0) return false;
      }
      return states.has(end);
    },
  };
}
