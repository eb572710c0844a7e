#!/usr/bin/env python3
"""Builds benches/data/code_edits.jsonl: real one-file code edits from the histories of
public, permissively licensed repositories, for `thicket bench edits`.

An edit is a commit (not a merge) that changes exactly one Python, Rust or JavaScript source
file by a few lines (1 to 10 added plus removed), where the file before has 30 to 150 lines
and no line longer than 160 characters. The commit's subject is the instruction, the file
before is the prompt's file and the prediction, the file after is the reference answer.
From each repository the edits are taken evenly spread over its history, newest first,
so the set does not come from one period of one project.

Each output line: {"id", "repo", "commit", "path", "language", "license", "instruction",
"before", "after"}.

Usage:
    python3 benches/code_edits.py --out benches/data/code_edits.jsonl --per-repo 8 \\
        GIT_DIR=owner/name=LICENSE [...]

GIT_DIR is a bare clone (or any git directory) of owner/name; LICENSE names its license.
"""

import argparse
import json
import subprocess
import sys

LANGUAGES = {".py": "python", ".rs": "rust", ".js": "javascript", ".mjs": "javascript"}
SKIP_SUBJECT = ("merge", "release", "bump", "version", "revert", "prepare", "update changelog")


def git(git_dir, *args):
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True
    ).stdout


def language(path):
    for ext, lang in LANGUAGES.items():
        if path.endswith(ext):
            return lang
    return None


def candidates(git_dir):
    """(commit, subject, path) of every non-merge commit changing one source file a little,
    newest first."""
    log = git(git_dir, "log", "--no-merges", "--no-renames", "--format=@%H%x00%s", "--numstat", "HEAD")
    out = []
    commit = subject = None
    files = []

    def flush():
        if commit and len(files) == 1:
            added, removed, path = files[0]
            if added != "-" and 1 <= int(added) + int(removed) <= 10 and language(path):
                out.append((commit, subject, path))

    for line in log.decode("utf-8", "replace").splitlines():
        if line.startswith("@"):
            flush()
            commit, _, subject = line[1:].partition("\0")
            files = []
        elif line.strip():
            parts = line.split("\t")
            if len(parts) == 3:
                files.append(parts)
    flush()
    return out


def file_at(git_dir, rev, path):
    try:
        return git(git_dir, "show", f"{rev}:{path}").decode("utf-8")
    except (subprocess.CalledProcessError, UnicodeDecodeError):
        return None


def usable(before, after, subject):
    if before is None or after is None or before == after:
        return False
    lines = before.splitlines()
    if not 30 <= len(lines) <= 150 or max(len(line) for line in lines) > 160:
        return False
    if any(len(line) > 160 for line in after.splitlines()):
        return False
    s = subject.strip().lower()
    return 10 <= len(s) <= 100 and not s.startswith(SKIP_SUBJECT)


def edits(git_dir, repo, license_name, per_repo):
    found = []
    for commit, subject, path in candidates(git_dir):
        before = file_at(git_dir, f"{commit}^", path)
        after = file_at(git_dir, commit, path)
        if usable(before, after, subject):
            found.append((commit, subject, path, before, after))
    # Evenly spread over the history (newest first), one per file at most.
    picked, paths = [], set()
    step = max(1, len(found) // (per_repo * 2))
    for i in list(range(0, len(found), step)) + list(range(len(found))):
        commit, subject, path, before, after = found[i]
        if path in paths or len(picked) == per_repo:
            continue
        paths.add(path)
        picked.append(
            {
                "id": f"{repo.replace('/', '-')}-{commit[:10]}",
                "repo": repo,
                "commit": commit,
                "path": path,
                "language": language(path),
                "license": license_name,
                "instruction": subject.strip(),
                "before": before,
                "after": after,
            }
        )
    print(f"{repo}: {len(found)} usable edits, {len(picked)} taken", file=sys.stderr)
    return picked


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-repo", type=int, default=8)
    parser.add_argument("repos", nargs="+", help="GIT_DIR=owner/name=LICENSE")
    args = parser.parse_args()
    rows = []
    for spec in args.repos:
        git_dir, repo, license_name = spec.split("=")
        rows.extend(edits(git_dir, repo, license_name, args.per_repo))
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"{len(rows)} edits written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
