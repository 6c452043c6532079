"""The training text: the Perl documentation (POD) shipped by Debian 12's perl-doc package.

The corpus is every file of the installed perl-doc package whose path ends in ".pod"
(/usr/share/perl/5.36.0/pod/*.pod: perlfunc, perlop, perlre, the perl*delta release notes,
...), plain text in POD markup. It is rebuilt the same way everywhere:

  * the file list comes from `dpkg-query -L perl-doc`, filtered to ".pod", sorted by path
    (byte order);
  * a file ending in ".gz" would be decompressed (none of the selected files are);
  * file i (0-based, in that order) is held out when i % HELDOUT_EVERY == HELDOUT_EVERY - 1,
    so the held-out split samples the whole alphabet rather than its tail;
  * each split is its files' bytes concatenated in order, with nothing in between.

The number of files and a digest over (path, SHA-256 of contents) are pinned below; any
difference raises CorpusError, so a model is never evaluated against a different text by
accident. The package version is not pinned: Debian's updates to perl (security fixes) give
perl-doc a new version with the same .pod files (5.36.0-7+deb12u3 from bookworm and deb12u4
from bookworm-security hash alike), and a machine without the security archive has the
older one. The version the model was trained with is recorded (TRAINED_VERSION) and named in
the error when the files differ. Install the package with `apt-get install perl-doc`.

Run `python3 -m kvarn.lm.data` to print the split sizes, or with --write-heldout FILE to
write the held-out text for an evaluator.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import subprocess
import sys
from typing import List, Tuple

PACKAGE = "perl-doc"
TRAINED_VERSION = "5.36.0-7+deb12u4"  # recorded, not required: the digest is the pin
FILE_SUFFIX = ".pod"
EXPECTED_NUM_FILES = 206
# sha256 over "<path>\0<sha256 hex of file contents>\n" for every selected file, in order.
EXPECTED_FILES_DIGEST = "a354f819909fc46c333e0a69116b8240b4a58a67092c0e0a74327868d9550751"
HELDOUT_EVERY = 20


class CorpusError(RuntimeError):
    """The installed package is missing or is not the pinned version/contents."""


@dataclasses.dataclass(frozen=True)
class Corpus:
    train: bytes
    heldout: bytes
    train_files: Tuple[str, ...]
    heldout_files: Tuple[str, ...]
    package: str
    version: str
    files_digest: str

    def describe(self) -> dict:
        return {
            "package": self.package,
            "version": self.version,
            "file_suffix": FILE_SUFFIX,
            "num_files": len(self.train_files) + len(self.heldout_files),
            "files_digest": self.files_digest,
            "heldout_rule": f"sorted index % {HELDOUT_EVERY} == {HELDOUT_EVERY - 1}",
            "train_files": len(self.train_files),
            "heldout_files": list(self.heldout_files),
            "train_bytes": len(self.train),
            "heldout_bytes": len(self.heldout),
        }


def _dpkg(*args: str) -> str:
    try:
        res = subprocess.run(["dpkg-query", *args], check=False, capture_output=True,
                             text=True)
    except FileNotFoundError as e:
        raise CorpusError("dpkg-query not found: the corpus needs a Debian system") from e
    if res.returncode != 0:
        raise CorpusError(f"dpkg-query {' '.join(args)} failed ({res.stderr.strip()}); "
                          f"install it with: apt-get install {PACKAGE}")
    return res.stdout


def installed_version() -> str:
    out = _dpkg("-W", "-f=${Status}\t${Version}", PACKAGE)
    status, _, version = out.partition("\t")
    if not status.endswith(" installed"):
        raise CorpusError(f"{PACKAGE} is not installed (status '{status}'); "
                          f"install it with: apt-get install {PACKAGE}")
    return version


def list_files(version: str) -> List[str]:
    """The selected files of the installed package (`version`, for the error), sorted."""
    paths = [p for p in _dpkg("-L", PACKAGE).splitlines() if p.endswith(FILE_SUFFIX)]
    paths = sorted(set(paths), key=lambda p: p.encode())
    if len(paths) != EXPECTED_NUM_FILES:
        raise CorpusError(f"{PACKAGE} {version} lists {len(paths)} '{FILE_SUFFIX}' files, "
                          f"expected {EXPECTED_NUM_FILES}")
    return paths


def read_text_file(path: str) -> bytes:
    with open(path, "rb") as f:
        raw = f.read()
    return gzip.decompress(raw) if path.endswith(".gz") else raw


def is_heldout(index: int) -> bool:
    return index % HELDOUT_EVERY == HELDOUT_EVERY - 1


def load_corpus(verify: bool = True) -> Corpus:
    """Reads the corpus from the installed package.

    With verify (the default) a digest mismatch raises CorpusError; verify=False is for
    re-pinning after a deliberate package change.
    """
    version = installed_version()
    paths = list_files(version)
    digest = hashlib.sha256()
    train, heldout = [], []
    train_files, heldout_files = [], []
    for i, path in enumerate(paths):
        data = read_text_file(path)
        digest.update(f"{path}\0{hashlib.sha256(data).hexdigest()}\n".encode())
        if is_heldout(i):
            heldout.append(data)
            heldout_files.append(path)
        else:
            train.append(data)
            train_files.append(path)
    files_digest = digest.hexdigest()
    if verify and files_digest != EXPECTED_FILES_DIGEST:
        raise CorpusError(f"{PACKAGE} {version}: files digest is {files_digest}, expected "
                          f"{EXPECTED_FILES_DIGEST}: the installed files differ from the "
                          f"ones the model was trained on ({PACKAGE} {TRAINED_VERSION}); "
                          f"install that version or retrain and re-pin")
    return Corpus(train=b"".join(train), heldout=b"".join(heldout),
                  train_files=tuple(train_files), heldout_files=tuple(heldout_files),
                  package=PACKAGE, version=version, files_digest=files_digest)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-heldout", metavar="FILE", help="write the held-out text here")
    ap.add_argument("--write-train", metavar="FILE", help="write the training text here")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip the digest check (to re-pin after a package change)")
    args = ap.parse_args(argv)
    try:
        corpus = load_corpus(verify=not args.no_verify)
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    d = corpus.describe()
    print(f"package      {d['package']} {d['version']}")
    print(f"files        {d['num_files']} '{FILE_SUFFIX}' files, digest {d['files_digest']}")
    print(f"train        {d['train_files']} files, {d['train_bytes']} bytes")
    print(f"held-out     {len(d['heldout_files'])} files ({d['heldout_rule']}), "
          f"{d['heldout_bytes']} bytes")
    for p in corpus.heldout_files:
        print(f"  {p}")
    for path, text in ((args.write_heldout, corpus.heldout), (args.write_train, corpus.train)):
        if path:
            with open(path, "wb") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
