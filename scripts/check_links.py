#!/usr/bin/env python3
"""Checks the relative links of the project's Markdown files: every linked
file exists and every `#anchor` names a heading of its target, as GitHub
renders anchors (lower case, punctuation dropped, spaces to hyphens).

    python scripts/check_links.py        # part of `make lint`

Exits 1 and lists the broken links when there are any.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[`*_]", "", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        in_code = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    in_code = not in_code
                    continue
                m = re.match(r"^#{1,6}\s+(.*)", line)
                if m and not in_code:
                    base = slug(m.group(1))
                    n = seen.get(base, 0)
                    seen[base] = n + 1
                    found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def links(path):
    in_code = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                in_code = not in_code
                continue
            if in_code:
                continue
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                yield number, target


def main():
    files = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    broken = []
    for rel in files:
        path = os.path.join(ROOT, rel)
        for number, target in links(path):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                broken.append(f"{rel}:{number}: {target}: no such file")
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                broken.append(f"{rel}:{number}: {target}: no heading '#{anchor}' in {os.path.relpath(dest, ROOT)}")
    for b in broken:
        print(b)
    if broken:
        sys.exit(1)
    print(f"checked the links of {len(files)} Markdown files")


if __name__ == "__main__":
    main()
