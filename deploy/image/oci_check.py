#!/usr/bin/env python3
"""Checks an OCI image archive (the image layout as a tar) and unpacks it.

  oci_check.py ARCHIVE --tag TAG [--unpack DIR]

Checks: oci-layout says 1.0.0; index.json names a manifest tagged TAG
(org.opencontainers.image.ref.name); every blob a descriptor names
(manifest, config, layers) exists with that size and sha256; the config's
rootfs.diff_ids are the sha256 of the uncompressed layers; the config says
linux/amd64 and a non-root user. With --unpack, the layers are extracted in
order into DIR (as root: owners and device nodes kept). Exits 1 with the
first problem found.
"""
import argparse
import gzip
import hashlib
import json
import sys
import tarfile


def fail(msg):
    print(f"oci_check: FAILED: {msg}")
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("archive")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--unpack")
    args = ap.parse_args()

    with tarfile.open(args.archive) as tar:
        files = {m.name.lstrip("./"): m for m in tar.getmembers() if m.isfile()}

        def read(name):
            if name not in files:
                fail(f"{name} is not in the archive")
            return tar.extractfile(files[name]).read()

        def blob(desc, media_types):
            if desc.get("mediaType") not in media_types:
                fail(f"descriptor {desc.get('digest')}: mediaType "
                     f"{desc.get('mediaType')}, want one of {media_types}")
            algo, _, hexdigest = desc["digest"].partition(":")
            if algo != "sha256":
                fail(f"digest {desc['digest']}: not sha256")
            data = read(f"blobs/sha256/{hexdigest}")
            if hashlib.sha256(data).hexdigest() != hexdigest:
                fail(f"blob {hexdigest}: its sha256 is "
                     f"{hashlib.sha256(data).hexdigest()}")
            if len(data) != desc["size"]:
                fail(f"blob {hexdigest}: {len(data)} bytes, descriptor says "
                     f"{desc['size']}")
            return data

        layout = json.loads(read("oci-layout"))
        if layout.get("imageLayoutVersion") != "1.0.0":
            fail(f"oci-layout: {layout}")
        index = json.loads(read("index.json"))
        if index.get("schemaVersion") != 2:
            fail("index.json: schemaVersion is not 2")
        tagged = [m for m in index.get("manifests", [])
                  if m.get("annotations", {}).get(
                      "org.opencontainers.image.ref.name") == args.tag]
        if len(tagged) != 1:
            fail(f"index.json: {len(tagged)} manifests tagged {args.tag}")
        manifest = json.loads(blob(
            tagged[0], ["application/vnd.oci.image.manifest.v1+json"]))
        if manifest.get("schemaVersion") != 2:
            fail("manifest: schemaVersion is not 2")
        config = json.loads(blob(
            manifest["config"], ["application/vnd.oci.image.config.v1+json"]))
        layers = []
        for desc in manifest["layers"]:
            data = blob(desc, ["application/vnd.oci.image.layer.v1.tar+gzip",
                               "application/vnd.oci.image.layer.v1.tar"])
            if desc["mediaType"].endswith("+gzip"):
                data = gzip.decompress(data)
            layers.append(data)
        diff_ids = ["sha256:" + hashlib.sha256(d).hexdigest() for d in layers]
        if config.get("rootfs", {}).get("diff_ids") != diff_ids:
            fail(f"config rootfs.diff_ids {config.get('rootfs')} are not the "
                 f"sha256 of the uncompressed layers {diff_ids}")
        if (config.get("os"), config.get("architecture")) != ("linux", "amd64"):
            fail(f"config: os/architecture {config.get('os')}/"
                 f"{config.get('architecture')}")
        user = config.get("config", {}).get("User", "")
        if user in ("", "0", "root") or user.startswith("0:"):
            fail(f"config: runs as root (User '{user}')")
        print(f"oci_check: ok: {args.archive}: tag {args.tag}, "
              f"{len(layers)} layer(s), {sum(map(len, layers)) >> 20} MiB "
              f"uncompressed, user {user}")

    if args.unpack:
        import io
        for data in layers:
            with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                names = [m.name for m in layer.getmembers()]
                for bad in names:
                    parts = bad.split("/")
                    if bad.startswith("/") or ".." in parts:
                        fail(f"layer entry {bad} escapes the root")
                layer.extractall(args.unpack, numeric_owner=True)
        print(f"oci_check: unpacked into {args.unpack}")


if __name__ == "__main__":
    main()
