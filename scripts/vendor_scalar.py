"""`make vendor-docs`: put Scalar's API reference (the npm package `@scalar/api-reference`, its
standalone browser bundle) in static/vendor/, and record what was put there.

`npm pack` fetches the package's tarball and checks it against the registry's integrity hash;
this script takes the one file /docs loads out of it, byte for byte, and writes its record to
static/vendor/scalar-api-reference.json: the version, the npm integrity of the tarball, the
sha256 of the file. The files are committed, so /docs works offline and without npm;
tests/test_docs_page.py holds the file to its record. To upgrade: change VERSION, run
`make vendor-docs`, check /docs (`make run`, then the browser tests), commit the new file and
record and delete the old file.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "@scalar/api-reference"
VERSION = "1.72.1"
BUNDLE = "package/dist/browser/standalone.js"
REPO = Path(__file__).resolve().parent.parent
VENDOR = REPO / "static" / "vendor"
RECORD = VENDOR / "scalar-api-reference.json"


def vendored_name(version: str) -> str:
    return f"scalar-api-reference-{version}.js"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="vendor-scalar-") as scratch:
        packed = subprocess.run(
            ["npm", "pack", f"{PACKAGE}@{VERSION}", "--json", "--pack-destination", scratch],
            capture_output=True,
            text=True,
            check=False,
        )
        if packed.returncode != 0:
            sys.stderr.write(f"npm pack {PACKAGE}@{VERSION} failed:\n{packed.stderr}")
            return 1
        [tarball] = json.loads(packed.stdout)
        with tarfile.open(Path(scratch) / tarball["filename"]) as archive:
            bundle = _read(archive, BUNDLE)
            license_name = json.loads(_read(archive, "package/package.json"))["license"]
    target = VENDOR / vendored_name(VERSION)
    target.write_bytes(bundle)
    record = {
        "package": PACKAGE,
        "version": VERSION,
        "license": license_name,
        "from": BUNDLE.removeprefix("package/"),
        "file": target.name,
        "sha256": hashlib.sha256(bundle).hexdigest(),
        "npmIntegrity": tarball["integrity"],
    }
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{target.relative_to(REPO)}: {len(bundle):,} bytes, sha256 {record['sha256']}")
    return 0


def _read(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(name)
    if member is None:
        raise SystemExit(f"{name} is not a file in {PACKAGE}@{VERSION}")
    return member.read()


if __name__ == "__main__":
    sys.exit(main())
