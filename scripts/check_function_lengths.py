#!/usr/bin/env python3
"""Lists the functions of the given folders' .cc files longer than --max lines (default 60), counted from the
first line of the signature to the closing brace at the signature's indentation; exits 1 if there are any.

    python3 scripts/check_function_lengths.py server client

Functions defined at namespace level are checked (bodies written inside a class declaration are not). A text
scan, not a parser: it relies on the project's formatting (a function's closing brace alone on its line)."""
import argparse
import glob
import os
import re
import sys

NOT_A_FUNCTION = re.compile(r'^(namespace|struct|class|enum|union|extern|#|//|\}|template|using|static_assert|'
                            r'constexpr [^(]*=|const [^(]*=|inline constexpr)')


def long_functions(path, limit):
    lines = open(path, encoding='utf-8').read().split('\n')
    found = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace() and not NOT_A_FUNCTION.match(line) and '(' in line:
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith(('{', ';', '}')):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith('{'):
                k = j + 1
                while k < len(lines) and lines[k] != '}':
                    k += 1
                if k - i + 1 > limit:
                    found.append((i + 1, k - i + 1, line.strip()))
                i = k
            else:
                i = j  # a declaration, or a body on one line
        i += 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('folders', nargs='+')
    parser.add_argument('--max', type=int, default=60)
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    failures = 0
    for folder in args.folders:
        for path in sorted(glob.glob(os.path.join(root, folder, '**', '*.cc'), recursive=True)):
            for line, length, signature in long_functions(path, args.max):
                print(f'{os.path.relpath(path, root)}:{line}: {length} lines: {signature[:100]}')
                failures += 1
    if failures:
        print(f'{failures} function(s) over {args.max} lines: split them into named steps', file=sys.stderr)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
