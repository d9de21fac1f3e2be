"""Every public function has its reference block, in the one form, directly above it.

    /*
     * flame_xxx: one-line summary.
     *
     * (optional paragraphs)
     *
     * Parameters:            ("Parameters: none." for a function without any)
     *   name     ...         (every parameter of the declaration, in order)
     * Thread-safety: ...
     * Returns: ...
     * Math: ...              (optional)
     */
    FLAME_API ... flame_xxx(...);

Usage: check_header_docs.py HEADER...; prints each violation and exits 1 if there is one.
"""
import re
import sys

SECTIONS = ("Parameters:", "Thread-safety:", "Returns:")


def declarations(lines):
    """(index of the FLAME_API line, function name, parameter names) of each declaration."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("FLAME_API "):
            j = i
            text = lines[i]
            while ";" not in text:
                j += 1
                text += " " + lines[j].strip()
            m = re.match(r"FLAME_API\s+[^(]*?\b(flame_\w+)\s*\((.*)\)\s*;", text)
            if not m:
                yield i, None, []
            else:
                params = []
                for p in m.group(2).split(","):
                    p = p.strip()
                    if p and p != "void":
                        params.append(re.findall(r"\w+", p)[-1])
                yield i, m.group(1), params
            i = j + 1
        else:
            i += 1


def block_above(lines, i):
    """The comment's lines (without ' * ') ending on line i - 1, or None."""
    if i == 0 or lines[i - 1].strip() != "*/":
        return None
    k = i - 2
    while k >= 0 and lines[k].strip() != "/*":
        if not lines[k].startswith(" *"):
            return None
        k -= 1
    if k < 0:
        return None
    return [ln[3:] if ln.startswith(" * ") else ln[2:] for ln in lines[k + 1:i - 1]]


def check(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    errors = []
    for i, name, params in declarations(lines):
        where = f"{path}:{i + 1}"
        if name is None:
            errors.append(f"{where}: cannot parse the declaration")
            continue
        block = block_above(lines, i)
        if block is None:
            errors.append(f"{where}: {name} has no '/* ... */' block directly above it")
            continue
        if not block or not block[0].startswith(f"{name}: ") or len(block[0]) <= len(name) + 2:
            errors.append(f"{where}: the block of {name} does not start with '{name}: summary'")
        at = []
        for s in SECTIONS:
            found = [k for k, ln in enumerate(block) if ln.startswith(s)]
            if len(found) != 1:
                errors.append(f"{where}: the block of {name} has {len(found)} '{s}' lines, expected 1")
                at.append(None)
            else:
                at.append(found[0])
        if None in at:
            continue
        if at != sorted(at):
            errors.append(f"{where}: the block of {name} has its sections out of order ({', '.join(SECTIONS)})")
            continue
        math = [k for k, ln in enumerate(block) if ln.startswith("Math:")]
        if math and math[0] < at[2]:
            errors.append(f"{where}: the block of {name} has 'Math:' before 'Returns:'")
        head = block[at[0]]
        if head.strip() == "Parameters: none.":
            if params:
                errors.append(f"{where}: {name} has parameters {params} but its block says none")
            continue
        documented = []
        for ln in block[at[0] + 1:at[1]]:
            m = re.match(r"  (\w+) ", ln)
            if m:
                documented.append(m.group(1))
        if documented != params:
            errors.append(f"{where}: {name} documents parameters {documented}, its declaration has {params}")
    return errors


def main(paths):
    errors = []
    for p in paths:
        errors += check(p)
    for e in errors:
        print(e)
    n = sum(1 for p in paths for _ in declarations(open(p, encoding="utf-8").read().split("\n")))
    print(f"header docs: {n} functions in {len(paths)} headers, {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
