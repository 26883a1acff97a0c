"""The agent task benchmark: real coding tasks given to real agent CLIs, run headless against an
OpenAI-compatible server; success is the task's own tests passing afterwards.

Tasks are Exercism's Python practice exercises (a checkout of the public `exercism/python`
repository, `exercises/practice/*`), the set aider's code-editing benchmark is built on. Only the
exercises whose names start with a-m are used unless `--letters` says otherwise: n-z are a
held-out set, checked separately.

For each exercise and client: a throwaway git repository with the exercise's instructions and stub
(never its tests); the client is run headless with aider's benchmark prompt ("modify the supplied
files, keep the names, standard library only"); then the tests are copied in and run by the
benchmark. A failure gets one retry with the failing test output (the last 50 lines), as aider's
benchmark does. Every request the client sends goes through a measuring proxy (requests, tool
calls, prompt / cached / output tokens, time to the first byte of each answer). Against cachet each
exercise is one task, grouped the way a user's runs would be: Codex is left as it is (cachet opens
a task for the run id Codex sends as `session-id`, and the retry resumes the same Codex session);
for aider and Qwen Code, which send no run id, the benchmark opens a task (`POST /v1/tasks`) and
its id goes in the `X-Cachet-Task` header (aider's through LiteLLM's `extra_headers`; Qwen Code's
through the proxy, since with `--bare` Qwen Code reads no settings, `customHeaders` included). The outcome is reported (`POST
/v1/tasks/{id}/outcome`) with the test output as evidence, so cachet's ledger and `cachet report
--group-by task` show cost per successful task.

    python scripts/agent_bench.py --client aider-whole --base http://127.0.0.1:8080/v1 --key TOKEN \
        --model default --exercism DIR --limit 10 --out results.jsonl [--cachet] [--tools DIR]

One JSON line per task goes to --out; a summary table to stdout.

Repository tasks (`--repo-tasks FILE --repo-git DIR`, made by scripts/repo_tasks.py from a public
repository's history) are multi-file: the repository at a commit's parent, the commit message as
the task, the commit's test files (not in the working tree during the run) passing afterwards as
success. With `--bind`, each task's working tree is registered with cachet as a watched repository
(`"watch": true`) and the client is bound to it through its own settings (docs/agents.md,
"Repository context for any client": Qwen Code and aider by the model name, Codex by the
`X-Cachet-Repository` header), so its prompts carry the repository context and follow its edits.
Each row then also has the first turn's time to first byte and the bytes of tool output the client
sent back (what its tools read). With `--prewarm` (and `--bind`), an earlier session of the same
client on the same repository comes first — one turn asking for a one-word answer, its work-tree
changes undone — so the measured session is a new session on a pre-warmed repository, as a
developer's second session of the day is; and once the tests have run, one more turn of the
measured session (a one-word answer again) is a warm follow-up turn. Each row then has the
warm-up's first-turn TTFT, the measured session's, the median TTFT of its own later turns and
the follow-up turn's (`probe_ttft_s`).
"""
import argparse
import http.client
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

WARMUP_PROMPT = "Reply with the single word: ready. Do not call any tool and do not change any file."
FOLLOWUP_PROMPT = "Reply with the single word: done. Do not call any tool and do not change any file."

REPO_PROMPT = """{message}

Make this change in the repository in the working directory. Its tests ({tests}) will be run
afterwards with `python -m unittest`; they are not in the working tree now. Standard library only.
"""

PROMPT = """{instructions}
####

Use the above instructions to modify the supplied files: {files}
Don't change the names of existing functions or classes, as they may be referenced from other code like unit tests, etc.
Only use standard python libraries, don't suggest installing any packages.
"""

RETRY = """{output}
####

See the testing errors above.
The tests are correct, don't try and change them.
Fix the code in {files} to resolve the errors.
"""

# Qwen Code's short system prompt (docs/agents.md, "Agent clients"): its own ~40,000-character one
# leaves a small model answering in prose.
QWEN_SYSTEM = """You are Qwen Code, a coding agent working in the user's git repository. To look at a file, call
the read_file tool with its absolute path (the working directory is given in the first message);
to change a file, call the edit tool with the exact text to replace and its replacement; to run a
command, call run_shell_command. Call a tool first when the answer depends on a file, then answer
briefly from what the tool returned.
"""

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization", "host",
       "content-length"}


class Meter:
    """What the proxy saw during one task."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset(None)

    def reset(self, task):
        with getattr(self, "lock", threading.Lock()):
            self.task = task
            self.requests = 0
            self.errors = 0
            self.tool_calls = 0
            self.patches = 0
            self.prompt = 0
            self.cached = 0
            self.output = 0
            self.ttft = []
            self.prompts = []
            self.client_sessions = []
            self.tool_bytes = 0
            self.tool_ids = set()

    def snapshot(self):
        with self.lock:
            return {"requests": self.requests, "http_errors": self.errors, "tool_calls": self.tool_calls,
                    "apply_patch_calls": self.patches,
                    "prompt_tokens": self.prompt, "cached_tokens": self.cached, "output_tokens": self.output,
                    "ttft_s": [round(t, 3) for t in self.ttft], "prompt_tokens_each": list(self.prompts),
                    "tool_output_bytes": self.tool_bytes}

    def usage(self, u):
        if not isinstance(u, dict):
            return
        prompt = u.get("prompt_tokens") or u.get("input_tokens") or 0
        self.prompt += prompt
        self.prompts.append(prompt)
        self.output += u.get("completion_tokens") or u.get("output_tokens") or 0
        details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
        self.cached += (details or {}).get("cached_tokens") or 0


def tool_outputs(meter, body):
    """Adds the tool output a request carries for the first time (chat `tool` messages, Responses
    `function_call_output` / `custom_tool_call_output` items): what the client's tools read."""
    try:
        doc = json.loads(body)
    except ValueError:
        return
    if not isinstance(doc, dict):
        return
    items = []
    for m in doc.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "tool":
            items.append((m.get("tool_call_id"), m.get("content")))
    for i in doc.get("input") if isinstance(doc.get("input"), list) else []:
        if isinstance(i, dict) and i.get("type") in ("function_call_output", "custom_tool_call_output"):
            items.append((i.get("call_id"), i.get("output")))
    with meter.lock:
        for call, content in items:
            key = call or json.dumps(content)[:200]
            if key in meter.tool_ids:
                continue
            meter.tool_ids.add(key)
            meter.tool_bytes += len(content if isinstance(content, str) else json.dumps(content))


def account(meter, body, streamed):
    """Counts the usage and tool calls of one answer (a JSON body or server-sent events)."""
    docs = []
    if streamed:
        for line in body.decode("utf-8", "replace").splitlines():
            if line.startswith("data: ") and line[6:].strip() not in ("", "[DONE]"):
                try:
                    docs.append(json.loads(line[6:]))
                except ValueError:
                    pass
    else:
        try:
            docs.append(json.loads(body))
        except ValueError:
            return
    calls, patches = set(), set()
    with meter.lock:
        for d in docs:
            if not isinstance(d, dict):
                continue
            meter.usage(d.get("usage"))
            if d.get("type") in ("response.completed", "response.incomplete"):
                r = d.get("response") or {}
                meter.usage(r.get("usage"))
                calls.update(i.get("id") for i in r.get("output") or []
                             if i.get("type") in ("function_call", "custom_tool_call"))
                patches.update(i.get("id") for i in r.get("output") or [] if i.get("name") == "apply_patch")
            if d.get("object") == "response":
                meter.usage(d.get("usage"))
                calls.update(i.get("id") for i in d.get("output") or []
                             if i.get("type") in ("function_call", "custom_tool_call"))
                patches.update(i.get("id") for i in d.get("output") or [] if i.get("name") == "apply_patch")
            for c in d.get("choices") or []:
                msg = c.get("message") or c.get("delta") or {}
                for tc in msg.get("tool_calls") or []:
                    calls.add((tc.get("id"), tc.get("index")) if tc.get("id") else None)
        calls.discard(None)
        patches.discard(None)
        meter.tool_calls += len(calls)
        meter.patches += len(patches)


def start_proxy(upstream, meter, add_task_header):
    """A forwarding proxy on a free port; returns its base URL (same path prefix as `upstream`)."""
    target = urllib.parse.urlsplit(upstream)

    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def forward(self, method):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            # Qwen Code with `--bare` reads no settings (so no `customHeaders`): the proxy adds
            # the task header for it.
            if add_task_header and meter.task and not any(k.lower() == "x-cachet-task" for k in headers):
                headers["X-Cachet-Task"] = meter.task
            run = self.headers.get("session-id")
            with meter.lock:
                if run and run not in meter.client_sessions:
                    meter.client_sessions.append(run)
            started = time.monotonic()
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=3600)
            if method == "POST" and body:
                tool_outputs(meter, body)
            conn.request(method, self.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            self.send_response(answer.status)
            streamed = "event-stream" in (answer.getheader("content-type") or "")
            for k, v in answer.getheaders():
                if k.lower() not in HOP:
                    self.send_header(k, v)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            seen, first = [], None
            while True:
                chunk = answer.read1(65536)
                if not chunk:
                    break
                if first is None:
                    first = time.monotonic() - started
                seen.append(chunk)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            conn.close()
            if method == "POST":
                with meter.lock:
                    meter.requests += 1
                    if answer.status >= 400:
                        meter.errors += 1
                    elif first is not None:
                        meter.ttft.append(first)
                if answer.status < 400:
                    account(meter, b"".join(seen), streamed)

        def do_POST(self):
            self.forward("POST")

        def do_GET(self):
            self.forward("GET")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}{target.path.rstrip('/')}"


def exercises(root, letters, names, limit):
    practice = os.path.join(root, "exercises", "practice")
    lo, hi = letters.split("-")
    out = []
    for slug in sorted(os.listdir(practice)):
        if not (lo <= slug[0] <= hi):
            continue
        if names and slug not in names:
            continue
        config = json.load(open(os.path.join(practice, slug, ".meta", "config.json")))
        out.append((slug, os.path.join(practice, slug), config["files"]))
    return out[:limit] if limit else out


def instructions(folder):
    text = ""
    for name in ("introduction.md", "instructions.md", "instructions.append.md"):
        path = os.path.join(folder, ".docs", name)
        if os.path.exists(path):
            text += open(path).read().strip() + "\n\n"
    return text.strip()


def run_tests(work, folder, files):
    for t in files["test"]:
        shutil.copy(os.path.join(folder, t), os.path.join(work, t))
    try:
        modules = [t[:-3] for t in files["test"]]
        p = subprocess.run([sys.executable, "-m", "unittest", *modules], cwd=work, capture_output=True, text=True,
                           timeout=180, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        output, ok = (p.stdout + p.stderr), p.returncode == 0
    except subprocess.TimeoutExpired:
        output, ok = "the tests timed out after 180 s", False
    for t in files["test"]:
        os.remove(os.path.join(work, t))
    return ok, output


def git(work, *args):
    subprocess.run(["git", *args], cwd=work, check=True, capture_output=True)


def client_command(args, work, files, message, base, task, resume=None, repo=None):
    """The command line (and environment) that runs the client once on `message`; `repo`: the
    cachet repository the client is bound to."""
    env = dict(os.environ)
    tools = args.tools
    # Bound by the model name, except Codex (a header: its model keeps its catalogue entry).
    model = f"{args.model}@{repo}" if repo and args.client != "codex" else args.model
    if args.client.startswith("aider"):
        fmt = args.client.split("-", 1)[1]
        settings = {"name": f"openai/{model}", "edit_format": fmt,
                    "extra_params": {"max_tokens": 2048}}
        if task:
            settings["extra_params"]["extra_headers"] = {"X-Cachet-Task": task}
        with open(os.path.join(work, ".aider.model.settings.yml"), "w") as f:
            f.write(json.dumps([settings]))  # JSON is YAML
        cmd = [os.path.join(tools, "aider-venv", "bin", "aider"), "--model", f"openai/{model}",
               "--openai-api-base", base, "--openai-api-key", args.key, "--edit-format", fmt, "--yes-always",
               "--no-auto-commits", "--no-dirty-commits", "--no-gitignore", "--no-show-model-warnings",
               "--no-check-update", "--no-analytics", "--no-pretty", "--no-stream", "--map-tokens", "0",
               "--model-settings-file", ".aider.model.settings.yml", f"--message={message}", *files]
        env["HOME"] = os.path.join(args.state, "home-aider")
        return cmd, env
    if args.client == "codex":
        home = os.path.join(args.state, "home-codex")
        os.makedirs(home, exist_ok=True)
        catalog = os.path.join(home, "catalog.json")
        shutil.copy(os.path.join(os.path.dirname(__file__), "fixtures", "codex-model-catalog.json"), catalog)
        pairs = ([f'"X-Cachet-Task" = "{task}"'] if task else []) + ([f'"X-Cachet-Repository" = "{repo}"'] if repo else [])
        headers = f'http_headers = {{ {", ".join(pairs)} }}\n' if pairs else ""
        with open(os.path.join(home, "config.toml"), "w") as f:
            f.write(f'model = "{args.model}"\nmodel_provider = "bench"\nweb_search = "disabled"\n'
                    f'model_catalog_json = "{catalog}"\n\n[model_providers.bench]\nname = "bench"\n'
                    f'base_url = "{base}"\nenv_key = "BENCH_KEY"\nwire_api = "responses"\n{headers}\n'
                    f'[features]\nmulti_agent = false\ngoals = false\n')
        env.update(CODEX_HOME=home, BENCH_KEY=args.key)
        # A retry goes on in the same Codex session (same `session-id`, so the same cachet task).
        cmd = [os.path.join(tools, "node_modules", ".bin", "codex"), "exec", *(["resume"] if resume else []),
               "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--",
               *([resume] if resume else []), message]
        return cmd, env
    if args.client == "qwen":
        home = os.path.join(args.state, "home-qwen")
        os.makedirs(os.path.join(home, ".qwen"), exist_ok=True)
        system = os.path.join(home, ".qwen", "system.md")
        with open(system, "w") as f:
            f.write(QWEN_SYSTEM)
        env.update(OPENAI_BASE_URL=base, OPENAI_API_KEY=args.key, OPENAI_MODEL=model, HOME=home,
                   QWEN_SYSTEM_MD=system, QWEN_CODE_TOOL_CALL_STYLE="qwen-vl")
        cmd = [os.path.join(tools, "node_modules", ".bin", "qwen"), "--auth-type", "openai", "--approval-mode",
               "yolo", "--bare", *(["--continue"] if resume else []), f"--prompt={message}"]
        return cmd, env
    raise SystemExit(f"unknown client {args.client}")


def attempts(args, meter, work, files, message, base, task, check, repo=None):
    """Runs the client on `message`, then `check()` (the tests: `(ok, output)`); a failure gets
    `--retries` more runs with the failing output. Returns (ok, output, tries, the client's log)."""
    ok, output, tries, log = False, "", 0, ""
    for attempt in range(1 + args.retries):
        tries = attempt + 1
        resume = meter.client_sessions[0] if attempt and args.client == "codex" and meter.client_sessions else None
        cmd, env = client_command(args, work, files, message, base, task, resume, repo=repo)
        try:
            p = subprocess.run(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=args.timeout)
            log += p.stdout[-4000:] + p.stderr[-4000:]
        except subprocess.TimeoutExpired:
            log += f"\n[client timed out after {args.timeout} s]\n"
        ok, output = check()
        if ok:
            break
        tail = "\n".join(output.strip().splitlines()[-50:])
        message = RETRY.format(output=tail, files=" ".join(files))
    return ok, output, tries, log


def cachet_call(args, method, path, body=None):
    url = args.base.rstrip("/") + path
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"Bearer {args.key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def one_task(args, slug, folder, files, meter, base):
    work = tempfile.mkdtemp(prefix=f"bench-{slug}-", dir=args.state)
    for f in files["solution"]:
        shutil.copy(os.path.join(folder, f), os.path.join(work, f))
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "exercise")
    task = None
    if args.cachet and args.client != "codex":
        task = cachet_call(args, "POST", "/tasks", {"title": f"{args.client} {slug}"})["id"]
    meter.reset(task)
    started = time.monotonic()
    message = PROMPT.format(instructions=instructions(folder), files=" ".join(files["solution"]))
    ok, output, tries, log = attempts(args, meter, work, files["solution"], message, base, task,
                                      lambda: run_tests(work, folder, files))
    wall = time.monotonic() - started
    row = {"exercise": slug, "client": args.client, "target": args.target, "model": args.model, "solved": ok,
           "tries": tries, "wall_s": round(wall, 1), **meter.snapshot()}
    if args.cachet and args.client == "codex":
        # The task cachet opened for the Codex run (found by the run id Codex sent).
        found = [t for run in meter.client_sessions
                 for t in cachet_call(args, "GET", "/tasks?client_session=" + urllib.parse.quote(run))["data"]]
        task = found[0]["id"] if found else None
        row["client_sessions"] = list(meter.client_sessions)
    if task:
        cachet_call(args, "POST", f"/tasks/{task}/outcome",
                    {"status": "succeeded" if ok else "failed",
                     "evidence": {"tests": "passed" if ok else "failed", "output": output[-2000:], "tries": tries}})
        got = cachet_call(args, "GET", f"/tasks/{task}")
        row.update(task_id=task, ledger_requests=got.get("requests"), ledger_cost=got.get("cost"))
    with open(os.path.join(work, "client.log"), "w") as f:
        f.write(log)
    row["workdir"] = work
    return row


def bind(args, work, name):
    """Registers `work` as the tenant's watched repository `name`; its id once it is ready."""
    repo = cachet_call(args, "POST", "/repos", {"url": work, "name": name, "watch": True})
    deadline = time.monotonic() + 300
    while repo.get("status") != "ready":
        if repo.get("status") == "failed" or time.monotonic() > deadline:
            raise SystemExit(f"registering {work}: {repo}")
        time.sleep(0.2)
        repo = cachet_call(args, "GET", f"/repos/{repo['id']}")
    return repo["id"]


def one_turn(args, meter, work, base, repo, message, resume=None):
    """The client once on `message` outside the measured attempts (its output unused); what the
    proxy saw of it."""
    meter.reset(None)
    cmd, env = client_command(args, work, [], message, base, None, resume=resume, repo=repo)
    try:
        subprocess.run(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=args.timeout)
    except subprocess.TimeoutExpired:
        pass
    return meter.snapshot()


def warm_up(args, meter, work, base, repo):
    """An earlier session of the client on the bound repository (one turn, a one-word answer), so
    that the repository part is in the tenant's cache behind this client's preamble; whatever it
    changed in the work tree is undone. Returns what it cost."""
    started = time.monotonic()
    snap = one_turn(args, meter, work, base, repo, WARMUP_PROMPT)
    git(work, "reset", "-q", "--hard")
    git(work, "clean", "-qfd")
    return {"warmup_wall_s": round(time.monotonic() - started, 1), "warmup_requests": snap["requests"],
            "warmup_ttft_s": snap["ttft_s"][0] if snap["ttft_s"] else None,
            "warmup_prompt_tokens": snap["prompt_tokens"], "warmup_cached_tokens": snap["cached_tokens"]}


def follow_up(args, meter, work, base, repo, snap):
    """One more turn of the measured session once its tests have run (Codex: `exec resume`, Qwen
    Code: `--continue`), asking for a one-word answer: a warm follow-up turn's time to first byte,
    which a new session's first turn on a pre-warmed repository is compared with. `probe_continued`:
    its prompt was longer than the session's first (it carried the conversation)."""
    sessions = list(meter.client_sessions)
    if args.client == "codex" and not sessions:
        return {}
    first_prompt = snap["prompt_tokens_each"][0] if snap["prompt_tokens_each"] else 0
    # The tests were copied in and out of the watched tree: their snapshots' pre-warms settle first.
    time.sleep(5)
    got = one_turn(args, meter, work, base, repo, FOLLOWUP_PROMPT, resume=sessions[0] if sessions else "last")
    probe_prompt = got["prompt_tokens_each"][0] if got["prompt_tokens_each"] else 0
    return {"probe_ttft_s": got["ttft_s"][0] if got["ttft_s"] else None, "probe_requests": got["requests"],
            "probe_prompt_tokens": got["prompt_tokens"], "probe_cached_tokens": got["cached_tokens"],
            "probe_continued": probe_prompt > first_prompt}


def one_repo_task(args, spec, meter, base, attempt_no):
    """A repository task (scripts/repo_tasks.py): the client changes the repository at the
    commit's parent; the commit's tests decide."""
    import repo_tasks
    work = tempfile.mkdtemp(prefix=f"bench-{spec['id']}-", dir=args.state)
    repo_tasks.checkout(args.repo_git, spec["parent"], work)
    name = repo_id = None
    if args.bind:
        name = f"task-{spec['id']}-{args.client}-{attempt_no}"
        repo_id = bind(args, work, name)
    warm = {}
    if args.bind and args.prewarm:
        warm = warm_up(args, meter, work, base, name)
    task = None
    if args.cachet and args.client != "codex":
        task = cachet_call(args, "POST", "/tasks", {"title": f"{args.client} {spec['id']}"})["id"]
    meter.reset(task)
    started = time.monotonic()
    message = REPO_PROMPT.format(message=spec["message"], tests=", ".join(spec["tests"]))
    def check():
        # The commit's tests, then the working tree's own versions back (the client must not see them).
        repo_tasks.put_tests(args.repo_git, spec["commit"], spec["tests"], work)
        result = repo_tasks.run_tests(work, spec["tests"])
        subprocess.run(["git", "checkout", "-q", "--", *spec["tests"]], cwd=work, capture_output=True)
        return result

    ok, output, tries, log = attempts(args, meter, work, spec["sources"], message, base, task, check, repo=name)
    wall = time.monotonic() - started
    snap = meter.snapshot()
    probe = follow_up(args, meter, work, base, name, snap) if args.bind and args.prewarm else {}
    row = {"task": spec["id"], "commit": spec["commit"], "client": args.client, "target": args.target,
           "model": args.model, "bound": bool(args.bind), "solved": ok, "tries": tries, "wall_s": round(wall, 1),
           "first_turn_ttft_s": snap["ttft_s"][0] if snap["ttft_s"] else None,
           "followup_ttft_s": statistics.median(snap["ttft_s"][1:]) if len(snap["ttft_s"]) > 1 else None,
           **warm, **probe, **snap}
    if task:
        cachet_call(args, "POST", f"/tasks/{task}/outcome",
                    {"status": "succeeded" if ok else "failed",
                     "evidence": {"tests": "passed" if ok else "failed", "output": output[-2000:], "tries": tries}})
    if repo_id:
        cachet_call(args, "DELETE", f"/repos/{repo_id}")
    with open(os.path.join(work, "client.log"), "w") as f:
        f.write(log)
    row["workdir"] = work
    return row


def summary(rows):
    solved = [r for r in rows if r["solved"]]
    prompt = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    out = {
        "attempted": len(rows),
        "solved": len(solved),
        "solved_second_try": sum(1 for r in solved if r["tries"] == 2),
        "median_wall_s_per_solved": round(statistics.median([r["wall_s"] for r in solved]), 1) if solved else None,
        "cached_share": round(cached / prompt, 3) if prompt else None,
        "requests": sum(r["requests"] for r in rows),
        "tool_calls": sum(r["tool_calls"] for r in rows),
        "apply_patch_calls": sum(r["apply_patch_calls"] for r in rows),
        "http_errors": sum(r["http_errors"] for r in rows),
        "tool_calls_per_solved": round(sum(r["tool_calls"] for r in rows) / len(solved), 1) if solved else None,
        "tool_output_bytes": sum(r.get("tool_output_bytes", 0) for r in rows),
        "median_first_turn_ttft_s": statistics.median(
            [r["first_turn_ttft_s"] for r in rows if r.get("first_turn_ttft_s") is not None] or [0]),
        "median_followup_ttft_s": statistics.median(
            [r["followup_ttft_s"] for r in rows if r.get("followup_ttft_s") is not None] or [0]),
        "median_probe_ttft_s": statistics.median(
            [r["probe_ttft_s"] for r in rows if r.get("probe_ttft_s") is not None and r.get("probe_continued")]
            or [0]),
        "wall_s": round(sum(r["wall_s"] for r in rows), 1),
    }
    costs = [r.get("ledger_cost") for r in rows if r.get("ledger_cost") is not None]
    if costs and solved:
        out["cost_per_solved"] = round(sum(costs) / len(solved), 6)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--client", required=True, help="aider-whole, aider-diff, codex or qwen")
    ap.add_argument("--base", required=True, help="the server's OpenAI base URL (…/v1)")
    ap.add_argument("--key", default="none")
    ap.add_argument("--model", default="default")
    ap.add_argument("--target", default="cachet", help="a name for the server in the results")
    ap.add_argument("--cachet", action="store_true", help="open a cachet task per exercise and report outcomes")
    ap.add_argument("--exercism", help="a checkout of exercism/python")
    ap.add_argument("--repo-tasks", help="repository tasks (scripts/repo_tasks.py) instead of Exercism's")
    ap.add_argument("--repo-git", help="with --repo-tasks: a clone of their repository")
    ap.add_argument("--bind", action="store_true",
                    help="with --repo-tasks and --cachet: the client gets the repository context (a watched repository)")
    ap.add_argument("--prewarm", action="store_true",
                    help="with --bind: an earlier one-turn session of the client on the repository first")
    ap.add_argument("--letters", default="a-m", help="first letters of the exercises (default a-m; n-z are held out)")
    ap.add_argument("--names", default="", help="only these exercises (comma-separated)")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--retries", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per client run")
    ap.add_argument("--tools", required=True, help="where the clients are installed (node_modules, aider-venv)")
    ap.add_argument("--state", default=None, help="work folders and client homes (default: a temporary folder)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.state = args.state or tempfile.mkdtemp(prefix="agent-bench-")
    os.makedirs(args.state, exist_ok=True)
    meter = Meter()
    base = start_proxy(args.base, meter, add_task_header=args.cachet and args.client == "qwen")
    names = set(filter(None, args.names.split(",")))
    rows = []
    if args.repo_tasks:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        specs = json.load(open(args.repo_tasks))["tasks"]
        specs = [t for t in specs if not names or t["id"] in names][: args.limit or None]
        for n, spec in enumerate(specs):
            row = one_repo_task(args, spec, meter, base, n)
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("task", "bound", "solved", "tries", "wall_s", "requests",
                                                  "tool_calls", "first_turn_ttft_s", "followup_ttft_s")}), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        print(json.dumps({"client": args.client, "target": args.target, "model": args.model,
                          "bound": bool(args.bind), **summary(rows)}))
        return
    if not args.exercism:
        raise SystemExit("give --exercism (or --repo-tasks)")
    for slug, folder, files in exercises(args.exercism, args.letters, names, args.limit):
        row = one_task(args, slug, folder, files, meter, base)
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("exercise", "solved", "tries", "wall_s", "requests", "tool_calls")}),
              flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    print(json.dumps({"client": args.client, "target": args.target, "model": args.model, **summary(rows)}))


if __name__ == "__main__":
    main()
