#!/usr/bin/python3
"""Client and checks of bench/fleet.sh (Debian's python3, standard library only).

  stream     sends N text-to-image requests (OpenAI route, seeds given) through the balancer,
             P at a time, each retried as docs/DEPLOY.md tells a client; one JSON line per
             request (final status, attempts, PNG checked and hashed)
  reference  the same request specs sent once each straight to one server
  check      compares the stream with the references, HAProxy's stats and log and the
             servers' /metrics; prints the summary; exits 1 on a failed check
"""
import argparse
import base64
import concurrent.futures
import csv
import hashlib
import http.client
import io
import json
import random
import re
import struct
import sys
import threading
import time
import urllib.parse
import zlib

# (prompt, size, steps, seed): fast ones, and slower ones a kill can land in.
SPECS = [
    ("a red fox in fresh snow", 64, 2, 11),
    ("a lighthouse at dusk", 64, 2, 12),
    ("a bowl of ramen, top view", 64, 3, 13),
    ("a red fox in fresh snow", 256, 30, 21),
    ("an old tram in the rain", 64, 2, 14),
    ("a paper boat on a pond", 64, 3, 15),
    ("a lighthouse at dusk", 256, 30, 22),
    ("a cactus in a clay pot", 64, 2, 16),
]
RETRY_STATUS = {429, 502, 503, 504}


def body_of(spec):
    prompt, size, steps, seed = spec
    return json.dumps({"prompt": prompt, "size": f"{size}x{size}", "steps": steps, "seed": seed,
                       "response_format": "b64_json"})


def post(url, body, timeout):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/images/generations", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def png_check(data, size):
    """Decodes the PNG fully (chunk CRCs, the whole zlib stream, every row's filter); returns
    (ok, why)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return False, "no PNG signature"
    pos, idat, ihdr, ended = 8, [], None, False
    while pos < len(data):
        if pos + 12 > len(data):
            return False, "truncated chunk"
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if len(chunk) != n or pos + 12 + n > len(data):
            return False, "truncated chunk"
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if zlib.crc32(kind + chunk) != crc:
            return False, f"bad CRC in {kind!r}"
        pos += 12 + n
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            ended = True
            break
    if not ended or pos != len(data):
        return False, "no IEND at the end"
    if not ihdr:
        return False, "no IHDR"
    w, h, depth, color, _, _, interlace = ihdr
    if (w, h) != (size, size):
        return False, f"{w}x{h}, asked {size}x{size}"
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace != 0:
        return False, f"unexpected format depth {depth} colour {color} interlace {interlace}"
    z = zlib.decompressobj()
    raw = z.decompress(b"".join(idat)) + z.flush()
    if not z.eof or z.unused_data:
        return False, "incomplete zlib stream"
    stride = w * channels
    if len(raw) != h * (stride + 1):
        return False, f"{len(raw)} bytes of rows, expected {h * (stride + 1)}"
    prev = bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f > 4:
            return False, f"row {y}: filter {f}"
        for x in range(stride):
            a = row[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if f == 1:
                row[x] = (row[x] + a) & 255
            elif f == 2:
                row[x] = (row[x] + b) & 255
            elif f == 3:
                row[x] = (row[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[x] = (row[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = row
    return True, ""


def image_of(status, data, size):
    """(sha256 of the PNG, why not) of a reply."""
    if status != 200:
        return None, f"status {status}"
    try:
        png = base64.b64decode(json.loads(data)["data"][0]["b64_json"], validate=True)
    except Exception as e:  # noqa: BLE001 - any malformed reply is a failed check
        return None, f"malformed reply: {e}"
    ok, why = png_check(png, size)
    return (hashlib.sha256(png).hexdigest(), "") if ok else (None, why)


def one_request(i, args, deadline):
    """Sends request i, retrying as DEPLOY.md says: a seed is given, so sending it again is
    safe; on 429, 502, 503, 504, a connection error or a timeout, wait (exponential backoff
    with jitter) and retry, at most --retries times."""
    spec = SPECS[i % len(SPECS)]
    body = body_of(spec)
    attempts = []
    start = time.monotonic()
    result = {"i": i, "spec": i % len(SPECS)}
    for k in range(args.retries + 1):
        t = time.monotonic()
        try:
            status, data = post(args.url, body, args.timeout)
            attempts.append(status)
        except (OSError, http.client.HTTPException) as e:
            status, data = None, b""
            attempts.append(type(e).__name__)
        if status is not None and status not in RETRY_STATUS:
            break
        if k == args.retries or time.monotonic() > deadline:
            break
        delay = min(args.backoff * 2 ** k, 4.0) * random.uniform(0.5, 1.0)
        time.sleep(delay)
    result.update(status=status, attempts=attempts, seconds=round(time.monotonic() - start, 3))
    sha, why = image_of(status, data, spec[1])
    result.update(sha256=sha, problem=why)
    return result


def cmd_stream(args):
    deadline = time.monotonic() + args.deadline
    lock = threading.Lock()
    out = open(args.out, "w", encoding="utf-8")

    def run(i):
        r = one_request(i, args, deadline)
        with lock:
            out.write(json.dumps(r) + "\n")
            out.flush()
        return r

    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(run, range(args.requests)))
    out.close()
    bad = [r for r in results if r["status"] != 200 or not r["sha256"]]
    return 1 if bad else 0


def cmd_reference(args):
    refs = {}
    for n, spec in enumerate(SPECS):
        status, data = post(args.url, body_of(spec), args.timeout)
        sha, why = image_of(status, data, spec[1])
        if not sha:
            print(f"fleet_client: reference {n}: {why}", file=sys.stderr)
            return 1
        refs[n] = sha
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(refs, f)
    return 0


def read_stats(path):
    with open(path, encoding="utf-8") as f:
        text = f.read().lstrip("# ")
    return {row["svname"]: row for row in csv.DictReader(io.StringIO(text))
            if row["pxname"] == "klein"}


def read_metrics(path):
    images = errors = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith('klein_images_generated_total{route="/v1/images/generations"}'):
                images += int(float(line.split()[-1]))
            elif line.startswith("klein_errors_total"):
                errors += int(float(line.split()[-1]))
    return images, errors


# The httplog line: ... klein klein/klein1 0/0/0/812/812 200 3021 - - ---- 3/3/2/1/+1 0/0 "POST ..."
LOG_LINE = re.compile(r"\[(\d+/\w+/\d+:\d+:\d+:\d+)(\.\d+)\] klein klein/(\S+) (-?\d+)/(-?\d+)/(-?\d+)/(-?\d+)/\+?(\d+) (\d{3}) \d+ \S+ \S+ "
                      r"(\S{4}) \d+/\d+/\d+/\d+/(\+?)(\d+) ")


def cmd_check(args):
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    results = [json.loads(line) for line in open(args.results, encoding="utf-8")]
    refs = {int(k): v for k, v in json.load(open(args.refs, encoding="utf-8")).items()}
    events = {}
    for line in open(args.events, encoding="utf-8"):
        key, _, value = line.strip().partition("=")
        events[key] = value

    # Every request answered 200 in the end, with a complete image of the right size, the
    # same bytes as the same request sent straight to a healthy server.
    check(len(results) == args.requests, f"{len(results)} results of {args.requests} requests")
    for r in sorted(results, key=lambda r: r["i"]):
        if r["status"] != 200:
            failures.append(f"request {r['i']}: attempts {r['attempts']}, last not 200")
        elif not r["sha256"]:
            failures.append(f"request {r['i']}: {r['problem']}")
        elif r["sha256"] != refs[r["spec"]]:
            failures.append(f"request {r['i']}: image differs from the direct request's")
    retried = [r for r in results if len(r["attempts"]) > 1]
    client_retries = sum(len(r["attempts"]) - 1 for r in results)

    # HAProxy's log: a line per request; the retries field counts the attempts HAProxy made
    # again (with "+" when it went to another server).
    lb_lines, lb_retried, lb_retries, lb_status, lb_resent = [], 0, 0, {}, []
    for line in open(args.log, encoding="utf-8", errors="replace"):
        m = LOG_LINE.search(line)
        if m:
            lb_lines.append(m)
            n = int(m.group(12))
            lb_retried += n > 0
            lb_retries += n
            lb_status[m.group(9)] = lb_status.get(m.group(9), 0) + 1
            if n > 0:  # when it was accepted and answered, seconds since the epoch
                accepted = time.mktime(time.strptime(m.group(1), "%d/%b/%Y:%H:%M:%S")) \
                    + float(m.group(2))
                lb_resent.append((accepted, accepted + int(m.group(8)) / 1000, n))
        if line.startswith("<") and (" is DOWN" in line or " is UP" in line):
            print("haproxy: " + line.split(": ", 1)[-1].strip()[:150])
    check(len(lb_lines) == sum(len(r["attempts"]) for r in results),
          f"HAProxy logged {len(lb_lines)} requests, the client made "
          f"{sum(len(r['attempts']) for r in results)} attempts")

    # HAProxy's view: the killed server down, the restarted one up again, and each surviving
    # server's /metrics counting what HAProxy says it answered.
    final = read_stats(args.stats)
    before = read_stats(args.stats_before_restart)
    killed, restarted, kept = args.killed, args.restarted, args.kept
    check(final[killed]["status"].startswith("DOWN"),
          f"{killed} is {final[killed]['status']} at the end, expected DOWN")
    check(final[restarted]["status"].startswith("UP"),
          f"{restarted} is {final[restarted]['status']} at the end, expected UP")
    check(before[restarted]["status"].startswith("DOWN"),
          f"{restarted} was {before[restarted]['status']} while stopped, expected DOWN")
    check(int(final[restarted]["chkdown"]) >= 1, f"{restarted}: no DOWN transition counted")

    def counts(row):
        return {k: int(row[k] or 0) for k in
                ("stot", "hrsp_2xx", "hrsp_4xx", "hrsp_5xx", "wretr", "wredis", "eresp", "econ")}

    per_server = {name: counts(row) for name, row in final.items() if name.startswith("klein")}
    for name, count_200, errors_lb, extra in (
            (kept, per_server[kept]["hrsp_2xx"],
             per_server[kept]["hrsp_4xx"] + per_server[kept]["hrsp_5xx"], len(refs)),
            (restarted, per_server[restarted]["hrsp_2xx"] - counts(before[restarted])["hrsp_2xx"],
             per_server[restarted]["hrsp_4xx"] + per_server[restarted]["hrsp_5xx"]
             - counts(before[restarted])["hrsp_4xx"] - counts(before[restarted])["hrsp_5xx"], 0)):
        images, errors = read_metrics(f"{args.metrics_dir}/{name}.metrics")
        check(images == count_200 + extra,
              f"{name}: /metrics says {images} images, HAProxy saw {count_200} answered 200"
              + (f" (+{extra} direct)" if extra else ""))
        check(errors == errors_lb, f"{name}: /metrics says {errors} errors, HAProxy saw {errors_lb}")
        per_server[name]["metrics_images"] = images
        per_server[name]["metrics_errors"] = errors
    served = sum(per_server[n]["hrsp_2xx"] for n in per_server)
    check(served == lb_status.get("200", 0) == len(results),
          f"HAProxy: {served} answered 200 by the servers, {lb_status} in its log, "
          f"{len(results)} requests")

    # Where the kill and the restart landed, and how long HAProxy took to see them.
    check(events.get("kill_busy") == "true", "the SIGKILL did not land mid-generation")
    check(events.get("term_busy") == "true", "the SIGTERM did not land mid-generation")

    def since(a, b):
        return float(events[b]) - float(events[a])

    def resent_by(event):  # HAProxy's resent requests in flight (or queued) at the event
        t = float(events[event])
        hit = [n for a, b, n in lb_resent if a <= t <= b]
        return f"{len(hit)} requests resent by HAProxy ({sum(hit)} retries)"

    check(lb_retried + len(retried) >= 2, "the kill and the restart caused no retry")

    wall = float(events["stream_end"]) - float(events["stream_start"])
    print(f"requests: {len(results)} in {wall:.1f} s, {args.parallel} at a time; "
          f"{sum(r['status'] == 200 for r in results)} answered 200, "
          f"{sum(r['sha256'] == refs.get(r['spec']) for r in results)} images identical to "
          f"the direct requests' ({len(refs)} distinct)")
    print(f"client retries: {client_retries}"
          + (f" ({len(retried)} requests: " + ", ".join(f"#{r['i']} {r['attempts']}" for r in retried)
             + ")" if retried else ""))
    print(f"HAProxy retries: {lb_retries} on {lb_retried} requests; statuses in its log {lb_status}")
    lat = sorted(r["seconds"] for r in results)
    print(f"latency: median {lat[len(lat) // 2]:.2f} s, max {lat[-1]:.2f} s")
    print(f"SIGKILL {killed} (busy): DOWN after {since('kill', 'kill_down'):.2f} s; "
          + resent_by("kill"))
    print(f"SIGTERM {restarted} (busy): {resent_by('term')}; exited after "
          f"{since('term', 'term_exit'):.2f} s, "
          f"DOWN after {since('term', 'term_down'):.2f} s; started again, /health 200 after "
          f"{since('restart', 'restart_ready'):.2f} s, UP after {since('restart', 'restart_up'):.2f} s")
    print("per server (HAProxy stats; /metrics of the surviving processes):")
    print("  server    sessions  2xx  4xx  5xx  retries  redispatches  resp.errors  conn.errors  "
          "metrics images/errors")
    for name in sorted(per_server):
        c = per_server[name]
        m = (f"{c['metrics_images']}/{c['metrics_errors']}" if "metrics_images" in c else "-")
        print(f"  {name:8} {c['stot']:9} {c['hrsp_2xx']:4} {c['hrsp_4xx']:4} {c['hrsp_5xx']:4} "
              f"{c['wretr']:8} {c['wredis']:13} {c['eresp']:12} {c['econ']:12}  {m}")
    for f in failures:
        print(f"FAILED: {f}")
    print("fleet: " + ("FAILED" if failures else "all checks passed"))
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stream")
    s.add_argument("--url", required=True)
    s.add_argument("--requests", type=int, default=40)
    s.add_argument("--parallel", type=int, default=3)
    s.add_argument("--retries", type=int, default=4)
    s.add_argument("--backoff", type=float, default=0.5, help="first wait, doubled each time (s)")
    s.add_argument("--timeout", type=float, default=60, help="per attempt (s)")
    s.add_argument("--deadline", type=float, default=240, help="no new attempt after (s)")
    s.add_argument("--out", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--url", required=True)
    r.add_argument("--timeout", type=float, default=60)
    r.add_argument("--out", required=True)
    c = sub.add_parser("check")
    for name in ("results", "refs", "events", "log", "stats", "stats-before-restart",
                 "metrics-dir", "killed", "restarted", "kept"):
        c.add_argument("--" + name, required=True)
    c.add_argument("--requests", type=int, required=True)
    c.add_argument("--parallel", type=int, required=True)
    args = p.parse_args()
    return {"stream": cmd_stream, "reference": cmd_reference, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
