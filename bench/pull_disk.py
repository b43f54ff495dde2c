#!/usr/bin/env python3
"""Disk use and time of `klein pull` on a full-size model, served by a local fake Hub.

Serves a diffusers directory (e.g. one made by `klein synth`) with the Hub's file-list API
and resolve URLs (Range requests, LFS SHA-256s) on the loopback address, runs
`klein pull` against it, and samples the file system's used bytes every 50 ms to measure
the peak disk use independently of what klein reports. Runs the default pull (converted
while downloading) and, with --compare, `--keep-source` (download everything, then convert).

  bench/pull_disk.py --klein build/klein --model /tmp/synth-4b --out /tmp/pull-bench --compare
  bench/pull_disk.py ... --rate 150     # as over a 150 MB/s network

Python's standard library only.
"""
import argparse
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
import time


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def listing(model):
    files = []
    for root, _, names in os.walk(model):
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, model)
            size = os.path.getsize(path)
            item = {"type": "file", "path": rel, "size": size}
            if rel.endswith(".safetensors"):
                item["oid"] = "0" * 40
                item["lfs"] = {"oid": sha256_file(path), "size": size, "pointerSize": 134}
            else:
                with open(path, "rb") as f:
                    item["oid"] = git_blob_id(f.read())
            files.append(item)
    return files


def make_handler(model, repo, files, rate):
    body = json.dumps(files).encode()

    class Hub(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            tree = "/api/models/%s/tree/" % repo
            resolve = "/%s/resolve/" % repo
            if self.path.startswith(tree):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if not self.path.startswith(resolve):
                self.send_error(404)
                return
            rel = self.path[len(resolve):].split("/", 1)[1]
            path = os.path.join(model, rel)
            if not os.path.isfile(path):
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            size = os.path.getsize(path)
            begin, end = 0, size - 1
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                a, _, b = rng[6:].partition("-")
                begin = int(a)
                end = min(int(b), size - 1) if b else size - 1
                self.send_response(206)
                self.send_header("Content-Range", "bytes %d-%d/%d" % (begin, end, size))
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - begin + 1))
            self.end_headers()
            with open(path, "rb") as f:
                f.seek(begin)
                left = end - begin + 1
                t0, sent = time.time(), 0
                while left > 0:
                    chunk = f.read(min(left, 4 << 20))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)
                    sent += len(chunk)
                    if rate:  # a network of `rate` bytes per second
                        ahead = sent / rate - (time.time() - t0)
                        if ahead > 0:
                            time.sleep(ahead)

    return Hub


def used_bytes(path):
    s = os.statvfs(path)
    return (s.f_blocks - s.f_bfree) * s.f_frsize


def run_pull(klein, endpoint, repo, out, extra):
    os.makedirs(out, exist_ok=True)
    output = os.path.join(out, "pulled.klein")
    # A fixed date in the container's record, so that containers compare byte for byte.
    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME="/nonexistent-hf-home",
               SOURCE_DATE_EPOCH="1700000000")
    env.pop("HF_TOKEN", None)
    base = used_bytes(out)
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], used_bytes(out))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.time()
    p = subprocess.run([klein, "pull", repo, "--json", "-o", output] + extra, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.time() - t0
    stop.set()
    sampler.join()
    if p.returncode != 0:
        raise SystemExit("klein pull failed:\n" + p.stderr[-4000:])
    done = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")][-1]
    container = os.path.getsize(output)
    digest = sha256_file(output)
    os.remove(output)
    return {"seconds": round(seconds, 1), "container_bytes": container,
            "container_sha256": digest,
            "peak_disk_bytes_statvfs": peak[0] - base,
            "peak_disk_bytes_reported": done.get("peak_disk_bytes"),
            "freed_bytes": done.get("freed_bytes")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--klein", required=True)
    ap.add_argument("--model", required=True, help="a diffusers directory")
    ap.add_argument("--out", required=True, help="scratch directory for the pulls")
    ap.add_argument("--repo", default="acme/synthetic")
    ap.add_argument("--compare", action="store_true", help="also run --keep-source")
    ap.add_argument("--rate", type=float, default=0,
                    help="serve at most this many MB/s (a network); default: as fast as it goes")
    a = ap.parse_args()
    t0 = time.time()
    files = listing(a.model)
    print("listed %d files (%.1f GB) with their SHA-256 in %.0f s" % (
        len(files), sum(f["size"] for f in files) / 1e9, time.time() - t0), flush=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             make_handler(a.model, a.repo, files, a.rate * 1e6))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = "http://127.0.0.1:%d" % server.server_address[1]
    runs = {"converted while downloading": run_pull(a.klein, endpoint, a.repo, a.out, [])}
    if a.compare:
        kept = os.path.join(a.out, "sources")
        runs["--keep-source (download, then convert)"] = run_pull(
            a.klein, endpoint, a.repo, a.out, ["--keep-source", kept])
        shutil.rmtree(kept, ignore_errors=True)
    server.shutdown()
    downloaded = sum(f["size"] for f in files if f["path"].endswith(".safetensors"))
    print(json.dumps({"model": a.model, "rate_mb_per_s": a.rate or None, "weight_file_bytes": downloaded,
                      "largest_file_bytes": max(f["size"] for f in files), "runs": runs},
                     indent=2))


if __name__ == "__main__":
    main()
