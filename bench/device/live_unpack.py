"""On the lent GPU: keeps each parcel a call carried (``.live/parcel-N``, from
``live_pack.py``) in ``.live/box``, and once every part is there, checks the
whole against its SHA-256 and unpacks it into ``.live/site``. Calls after that
find the site in place (while the machine is warm) and carry nothing.

    python bench/device/live_unpack.py .live

Exit status 0 when ``.live/site`` holds the parcels' contents; 3 while parts
are still missing (it says which); 1 on a bad parcel.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path


def stash(live: Path) -> list[dict]:
    """Copies newly carried chunks into live/box; returns every stashed manifest."""
    box = live / "box"
    box.mkdir(parents=True, exist_ok=True)
    for manifest_path in sorted(live.glob("parcel-*/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        kept = box / f"part-{manifest['part']}.json"
        if kept.exists() and json.loads(kept.read_text()) == manifest:
            continue  # stashed by an earlier call
        shutil.copyfile(manifest_path.parent / "chunk", box / f"part-{manifest['part']}")
        kept.write_text(json.dumps(manifest))
        print(f"parcel {manifest['part']}/{manifest['parts']} stashed")
    return [json.loads(p.read_text()) for p in sorted(box.glob("part-*.json"))]


def unpack(live: Path) -> int:
    manifests = stash(live)
    if not manifests:
        print("no parcel carried or stashed: carry .live/parcel-1 (bench/device/live_wheels.sh)")
        return 3
    newest = max(manifests, key=lambda m: (m["parts"], m["sha256"]))
    sha, parts = newest["sha256"], newest["parts"]
    site = live / "site"
    stamp = site / ".sha256"
    if stamp.exists() and stamp.read_text() == sha:
        return 0
    have = sorted(m["part"] for m in manifests if m["sha256"] == sha)
    if have != list(range(1, parts + 1)):
        print(f"parcels {have} of {parts} here: carry the others, one a call")
        return 3
    chunks = [live / "box" / f"part-{i}" for i in range(1, parts + 1)]
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk.read_bytes())
    if digest.hexdigest() != sha:
        print("the parcels do not add up to their SHA-256: carry them again")
        return 1
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    cat = subprocess.Popen(["cat", *map(str, chunks)], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-xJf", "-", "-C", str(site)], stdin=cat.stdout, check=True)
    cat.wait()
    stamp.write_text(sha)
    print(f"unpacked {parts} parcel(s) into {site}")
    return 0


if __name__ == "__main__":
    sys.exit(unpack(Path(sys.argv[1])))
