"""The code runner: one ipykernel inside a kernel, driven for the agent (agent/execution.py).

A standalone script (stdlib, pyzmq and jupyter_client; nothing of this project). The
agent starts it in main1 (``docker exec -i`` as the kernel user, or a subprocess with the
kernel's environment, uid and limits) as ``python3 -u -c <this source>`` and speaks JSON
lines with it: commands on stdin, answers on stdout. It starts one ipykernel with
``jupyter_client.KernelManager`` and keeps it, so state persists between runs. Everything
runs in one thread around one poller (the kernel's sockets, stdin, a batch's pipes), so
there are no locks, and an interrupt is seen within one poll.

agent -> runner:
  {"op": "run", "mode": "query"|"batch", "run_id": str, "code": str, "options": {...},
   "limit": int}                                  start a run (one at a time)
  {"op": "input", "data": str}                    the line for a run waiting for input
  {"op": "interrupt"}                             interrupt the current run
  {"op": "complete", "id": int, "code": str, "cursor_pos": int}
  end of stdin                                    shut the kernel down and exit
runner -> agent:
  {"type": "ready"} | {"type": "unavailable", "reason": str}     first, once
  {"type": "records", "run_id": str, "records": [{"kind", "data", "mime"}, ...]}
  {"type": "waiting", "run_id": str}              the run waits for a line of input
  {"type": "done", "run_id": str, "status": "finished"|"exec-timeout", "exit_code": int|None,
   "error": str|None}                              error: the exception a query raised
                                                   (KeyboardInterrupt: a run interrupted)
  {"type": "completions", "id": int, "matches": [str, ...]}
  {"type": "log", "message": str}                 for the agent's log only

The output limit is enforced here, where the output is made: past ``limit`` bytes of record
data a run's output is dropped (never kept) and one notice says so; the run goes on.
"""

import codecs
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

CHUNK = 64 * 1024  # text records are cut to this size; buffered output is sent past it
RICH_MAX = 1024 * 1024  # the largest result/display record (one frame's data)
PREFERRED = ("image/png", "image/svg+xml", "text/html", "text/plain")
COMPLETIONS_MAX = 1000
COMPLETION_MAX = 1000
COMPLETE_TIMEOUT = 5.0
STDIN_PROBE = 0.5  # how long the first input() may take to reach the runner before a retry
START_TIMEOUT = 60.0
KILL_GRACE = 2.0
PIPE_GRACE = 1.0  # how long a finished batch command's pipes may stay open (background jobs)
# How long after the kernel went idle on a request its reply may still come (the shell and
# iopub sockets are not ordered): a kernel whose handler failed never sends one.
REPLY_GRACE = 2.0
KERNEL_LOG_LINE_MAX = 500
POLL_MS = 100
KERNEL_NAME = "bai-python3"
SOCKET_DIR_MAX = 64  # the parent of the runner's directory, so that socket paths fit 107 bytes
# ipykernel catches SystemExit and warns; the runner reports the exit code instead.
SETUP = (
    "import warnings as _w\n"
    "_w.filterwarnings('ignore', message='To exit: use .exit., .quit., or Ctrl-D.')\n"
    "del _w\n"
)


def send(message):
    line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    view = memoryview(line.encode("utf-8", "replace") + b"\n")
    while view:  # stdout is unbuffered (-u): a write may take only part
        view = view[os.write(1, view) :]


def size_text(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"


def utf8_size(text):
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def exit_status(returncode):
    return 128 - returncode if returncode < 0 else returncode


class Output:
    """One run's output: cut at the limit (with one notice), sent in coalesced lines."""

    def __init__(self, run_id, limit):
        self.run_id = run_id
        self.limit = limit
        self.used = 0
        self.cut = False
        self.records = []
        self.size = 0

    def text(self, kind, data):
        """stdout, stderr or error text; what passes the limit is dropped."""
        if not data or self.cut:
            return
        room = self.limit - self.used
        over = utf8_size(data) > room
        if over:
            data = data.encode("utf-8", "replace")[:room].decode("utf-8", "ignore")
        self.used += utf8_size(data)
        for start in range(0, len(data), CHUNK):
            self._add(kind, data[start : start + CHUNK], None)
        if over:
            self._notice_cut()

    def rich(self, kind, bundle):
        """A result or display: the preferred type whose data fits, else a notice."""
        offered = [m for m in PREFERRED if isinstance(bundle.get(m), str)]
        if not offered or self.cut:
            return
        room = self.limit - self.used
        for mime in offered:
            size = utf8_size(bundle[mime])
            if size <= min(room, RICH_MAX):
                self.used += size
                self._add(kind, bundle[mime], mime)
                return
        smallest = min(utf8_size(bundle[m]) for m in offered)
        if smallest > RICH_MAX:
            self.notice(f"[a {kind} of {size_text(smallest)} was dropped: larger than 1 MiB]")
        else:
            self._notice_cut()

    def notice(self, data):
        self._add("notice", data, None)

    def _notice_cut(self):
        if not self.cut:
            self.cut = True
            self.notice(
                f"[output cut: more than {size_text(self.limit)};"
                " the rest of this run's output was dropped]"
            )

    def _add(self, kind, data, mime):
        last = self.records[-1] if self.records else None
        if last and last["kind"] == kind and kind in ("stdout", "stderr"):
            if len(last["data"]) + len(data) <= CHUNK:
                last["data"] += data
                self.size += len(data)
                return
        self.records.append({"kind": kind, "data": data, "mime": mime})
        self.size += len(data)
        if self.size >= CHUNK:
            self.flush()

    def flush(self):
        if self.records:
            send({"type": "records", "run_id": self.run_id, "records": self.records})
            self.records = []
            self.size = 0


class Kernel:
    """One ipykernel, started by a KernelManager, and the runner's sockets to it."""

    def __init__(self, workdir, generation):
        import zmq
        from jupyter_client import KernelManager

        self.zmq = zmq
        # IPC sockets in a private directory: no port for anyone else on the host (TCP on
        # loopback, guarded by the session key, only when no short directory was found).
        if len(workdir) <= SOCKET_DIR_MAX + 20:
            where = {"transport": "ipc", "ip": os.path.join(workdir, f"k{generation}")}
        else:
            where = {"transport": "tcp", "ip": "127.0.0.1"}
        self.km = KernelManager(kernel_name=KERNEL_NAME, **where)
        self.km.connection_file = os.path.join(workdir, f"kernel-{generation}.json")
        self.log_path = os.path.join(workdir, "kernel.log")
        env = {k: v for k, v in os.environ.items() if k != "JUPYTER_PATH"}
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        # The kernel's own stdout and stderr must never reach the agent's pipe: ipykernel
        # sends what user code writes (fd 1 and 2 too) as messages.
        with open(self.log_path, "ab") as log:
            self.km.start_kernel(
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log
            )
        self.session = self.km.session
        ident = self.session.bsession  # stdin requests are routed to the shell's identity
        self.shell = self.km.connect_shell(identity=ident)
        self.stdin = self.km.connect_stdin(identity=ident)
        self.iopub = self.km.connect_iopub()

    def log_size(self):
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def log_line_since(self, start):
        """The last line the kernel wrote to its log since ``start`` (its error), or ""."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(start)
                written = log.read(64 * 1024)
        except OSError:
            return ""
        lines = [line.strip() for line in written.decode("utf-8", "replace").splitlines()]
        lines = [line for line in lines if line]
        return lines[-1][:KERNEL_LOG_LINE_MAX] if lines else ""

    def process(self):
        return getattr(self.km.provisioner, "process", None) or getattr(self.km, "kernel", None)

    def exit_code(self):
        """None while the kernel lives, else its exit status."""
        proc = self.process()
        if proc is None:
            return 1
        code = proc.poll()
        return None if code is None else exit_status(code)

    def request(self, socket, msg_type, content, parent=None):
        return self.session.send(socket, msg_type, content, parent=parent)["header"]["msg_id"]

    def receive(self, socket):
        """Every message waiting on ``socket`` (none when nothing is there)."""
        while True:
            _, msg = self.session.recv(socket, mode=self.zmq.NOBLOCK)
            if msg is None:
                return
            yield msg

    def wait_ready(self, deadline):
        """Until the kernel answers kernel_info and its iopub reaches us (late joiner)."""
        poller = self.zmq.Poller()
        poller.register(self.shell, self.zmq.POLLIN)
        poller.register(self.iopub, self.zmq.POLLIN)
        replied = heard = False
        while not (replied and heard):
            if time.monotonic() > deadline or self.exit_code() is not None:
                raise RuntimeError("the kernel did not start")
            self.request(self.shell, "kernel_info_request", {})
            until = time.monotonic() + 1.0
            while time.monotonic() < until and not (replied and heard):
                poller.poll(100)
                replied |= any(
                    m["msg_type"] == "kernel_info_reply" for m in self.receive(self.shell)
                )
                heard |= any(True for _ in self.receive(self.iopub))
        self.reach_stdin(deadline)
        self.execute(SETUP, silent=True)

    def reach_stdin(self, deadline):
        """Until an input() of the kernel reaches us. Its stdin socket (a ROUTER) drops a
        request for a peer whose connection is not complete yet, and that input() would
        then wait forever: so one is asked, answered, and asked again after an interrupt
        if it never came."""
        poller = self.zmq.Poller()
        poller.register(self.stdin, self.zmq.POLLIN)
        while time.monotonic() < deadline and self.exit_code() is None:
            msg_id = self.execute("input()", store_history=False)
            asked = None
            until = time.monotonic() + STDIN_PROBE
            while asked is None and time.monotonic() < until:
                poller.poll(50)
                asked = next(
                    (m for m in self.receive(self.stdin) if m["msg_type"] == "input_request"),
                    None,
                )
            if asked is not None:
                self.request(self.stdin, "input_reply", {"value": ""}, parent=asked)
            else:
                self.interrupt()
            if self.wait_reply(msg_id, deadline) and asked is not None:
                return
        raise RuntimeError("the kernel's input requests do not reach the runner")

    def wait_reply(self, msg_id, deadline):
        """Until the shell's reply to ``msg_id`` (False: none by the deadline)."""
        while time.monotonic() < deadline:
            self.shell.poll(100)
            for msg in self.receive(self.shell):
                if msg["parent_header"].get("msg_id") == msg_id:
                    return True
        return False

    def execute(self, code, silent=False, store_history=None):
        content = {
            "code": code,
            "silent": silent,
            "store_history": not silent if store_history is None else store_history,
            "user_expressions": {},
            "allow_stdin": not silent,
            "stop_on_error": False,
        }
        return self.request(self.shell, "execute_request", content)

    def interrupt(self):
        try:
            self.km.interrupt_kernel()  # a SIGINT to the kernel's process group
        except Exception:  # noqa: BLE001 - the signal itself is what matters
            proc = self.process()
            if proc is not None:
                os.killpg(proc.pid, signal.SIGINT)

    def close(self):
        for socket in (self.shell, self.stdin, self.iopub):
            socket.close(linger=0)
        try:
            self.km.shutdown_kernel(now=True)
        except Exception:  # noqa: BLE001 - it may be gone already
            proc = self.process()
            if proc is not None and proc.poll() is None:
                proc.kill()


class Run:
    """The run in progress: a query in the kernel, or a batch's shell commands."""

    def __init__(self, command):
        self.run_id = command["run_id"]
        self.mode = command.get("mode", "query")
        self.out = Output(self.run_id, int(command.get("limit") or 8 * 1024 * 1024))
        options = command.get("options") or {}
        timeout = float(options.get("timeout") or 0)
        self.deadline = time.monotonic() + timeout if timeout > 0 else None
        self.timed_out_at = None
        self.msg_id = None  # query: the execute_request
        self.reply = None
        self.idle = False
        self.idle_at = None
        self.interrupted = False
        self.log_start = 0  # the kernel's log size when the query was sent
        self.input_request = None  # the kernel's input_request while waiting
        # batch: the build command, then the exec command (the code when exec is absent)
        self.steps = [("build", options.get("build")), ("exec", options.get("exec") or None)]
        if self.steps[1][1] is None:
            self.steps[1] = ("exec", command.get("code") or None)
        self.step = None
        self.proc = None
        self.pipes = {}  # fd -> (pipe, kind, decoder)
        self.exited_at = None


class Runner:
    def __init__(self, workdir):
        import zmq

        self.zmq = zmq
        self.workdir = workdir
        self.poller = zmq.Poller()
        self.generation = 0
        self.kernel = None
        self.run = None
        self.completing = None  # (request id, msg_id, deadline)
        self.commands = bytearray()
        self.quitting = False

    # --- the kernel ---------------------------------------------------------------------

    def start_kernel(self):
        self.generation += 1
        self.kernel = Kernel(self.workdir, self.generation)
        self.kernel.wait_ready(time.monotonic() + START_TIMEOUT)
        for socket in (self.kernel.shell, self.kernel.stdin, self.kernel.iopub):
            self.poller.register(socket, self.zmq.POLLIN)

    def stop_kernel(self):
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            for socket in (kernel.shell, kernel.stdin, kernel.iopub):
                self.poller.unregister(socket)
            kernel.close()

    def restart_kernel(self, out):
        self.stop_kernel()
        try:
            self.start_kernel()
        except Exception as exc:  # noqa: BLE001 - told to the user; the next run tries again
            out.notice(f"[a fresh Python kernel did not start: {exc}]")

    # --- the loop -----------------------------------------------------------------------

    def serve(self):
        self.poller.register(0, self.zmq.POLLIN)
        while not self.quitting:
            ready = dict(self.poller.poll(POLL_MS))
            if ready.get(0):
                self.read_commands()
            kernel = self.kernel
            if kernel is not None:
                if kernel.iopub in ready:
                    for msg in kernel.receive(kernel.iopub):
                        self.on_iopub(msg)
                if kernel.shell in ready:
                    for msg in kernel.receive(kernel.shell):
                        self.on_shell(msg)
                if kernel.stdin in ready:
                    for msg in kernel.receive(kernel.stdin):
                        self.on_input_request(msg)
            run = self.run
            if run is not None:
                for fd in [fd for fd in run.pipes if ready.get(fd)]:
                    self.read_pipe(run, fd)
            self.tick()

    def read_commands(self):
        data = os.read(0, 1 << 20)
        if not data:
            self.quitting = True
            return
        self.commands += data
        while (end := self.commands.find(b"\n")) >= 0:
            line = bytes(self.commands[:end])
            del self.commands[: end + 1]
            if line.strip():
                self.command(json.loads(line))

    def command(self, command):
        op = command.get("op")
        if op == "run":
            self.start_run(command)
        elif op == "input":
            self.give_input(str(command.get("data", "")))
        elif op == "interrupt":
            self.interrupt()
        elif op == "complete":
            self.complete(command)

    def tick(self):
        now = time.monotonic()
        if self.completing is not None and now > self.completing[2]:
            self.answer_completions([])
        run = self.run
        if run is None:
            return
        if run.deadline is not None and run.timed_out_at is None and now > run.deadline:
            run.timed_out_at = now
            self.interrupt()
        if run.mode == "batch":
            self.tick_batch(run, now)
        else:
            self.tick_query(run, now)
        if self.run is run:
            run.out.flush()

    def finish(self, run, status, exit_code, error=None):
        run.out.flush()
        done = {"type": "done", "run_id": run.run_id, "status": status, "exit_code": exit_code}
        send({**done, "error": error})
        self.run = None

    # --- runs -----------------------------------------------------------------------------

    def start_run(self, command):
        if self.run is not None:
            send({"type": "log", "message": f"run {command.get('run_id')} refused: one is going"})
            return
        run = self.run = Run(command)
        if run.mode == "batch":
            self.next_step(run)
            return
        if self.kernel is None or self.kernel.exit_code() is not None:
            run.out.notice("[the Python kernel had stopped; a fresh one was started]")
            self.restart_kernel(run.out)
        if self.kernel is None:
            self.finish(run, "finished", 1)
            return
        run.log_start = self.kernel.log_size()
        run.msg_id = self.kernel.execute(command.get("code") or "")

    def interrupt(self):
        run = self.run
        if run is None:
            return
        run.input_request = None  # an input() the interrupt ends waits for nothing more
        run.interrupted = True
        if run.proc is not None:
            try:
                os.killpg(run.proc.pid, signal.SIGINT)
            except (ProcessLookupError, PermissionError):
                pass
        elif self.kernel is not None:
            self.kernel.interrupt()

    def give_input(self, data):
        run = self.run
        if run is None or run.input_request is None or self.kernel is None:
            return
        self.kernel.request(
            self.kernel.stdin, "input_reply", {"value": data}, parent=run.input_request
        )
        run.input_request = None

    def complete(self, command):
        kernel = self.kernel
        if self.run is not None or kernel is None or self.completing is not None:
            # ipykernel answers one request at a time: none while code runs
            send({"type": "completions", "id": command.get("id"), "matches": []})
            return
        content = {"code": command.get("code", ""), "cursor_pos": command.get("cursor_pos", 0)}
        msg_id = kernel.request(kernel.shell, "complete_request", content)
        self.completing = (command.get("id"), msg_id, time.monotonic() + COMPLETE_TIMEOUT)

    def answer_completions(self, matches):
        request_id = self.completing[0]
        self.completing = None
        matches = [m[:COMPLETION_MAX] for m in matches if isinstance(m, str)][:COMPLETIONS_MAX]
        send({"type": "completions", "id": request_id, "matches": matches})

    # --- a query: the kernel's messages ---------------------------------------------------

    def on_iopub(self, msg):
        run = self.run
        if run is None or msg["parent_header"].get("msg_id") != run.msg_id:
            return
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            run.out.text(name, content.get("text") or "")
        elif kind == "execute_result":
            run.out.rich("result", content.get("data") or {})
        elif kind in ("display_data", "update_display_data"):
            run.out.rich("display", content.get("data") or {})
        elif kind == "error" and content.get("ename") != "SystemExit":
            run.out.text("error", "\n".join(content.get("traceback") or []) + "\n")
        elif kind == "status" and content.get("execution_state") == "idle":
            run.idle = True
            run.idle_at = time.monotonic()

    def on_shell(self, msg):
        parent = msg["parent_header"].get("msg_id")
        run = self.run
        if run is not None and parent == run.msg_id and msg["msg_type"] == "execute_reply":
            run.reply = msg["content"]
        elif self.completing is not None and parent == self.completing[1]:
            self.answer_completions(msg["content"].get("matches") or [])

    def on_input_request(self, msg):
        if msg["msg_type"] != "input_request":
            return
        run = self.run
        if run is None:  # nobody to ask: an empty line unblocks the kernel
            self.kernel.request(self.kernel.stdin, "input_reply", {"value": ""}, parent=msg)
            return
        run.input_request = msg
        run.out.text("stdout", msg["content"].get("prompt") or "")
        run.out.flush()
        send({"type": "waiting", "run_id": run.run_id})

    def tick_query(self, run, now):
        if run.reply is not None and run.idle:
            if run.timed_out_at is not None:
                self.finish(run, "exec-timeout", None)
            else:
                error = run.reply.get("ename") if run.reply.get("status") == "error" else None
                if error == "SystemExit":
                    error = None  # its code is the exit code
                self.finish(run, "finished", self.query_exit_code(run), error)
            return
        if run.reply is None and run.idle and now - run.idle_at > REPLY_GRACE:
            # The kernel's handler failed (e.g. ipykernel 6 on code holding a NUL): no
            # reply will come, and the run would wait for it for ever.
            why = self.kernel.log_line_since(run.log_start)
            run.out.notice(
                "[the Python kernel went idle without answering this run"
                + (f": {why}]" if why else "; see its log]")
            )
            self.finish(run, "finished", 1)
            return
        died = self.kernel.exit_code()
        stuck = run.timed_out_at is not None and now - run.timed_out_at > 2.5 * KILL_GRACE
        if died is None and not stuck:
            return
        if died is not None:
            run.out.notice(
                f"[the Python kernel stopped (exit status {died});"
                " a fresh one was started: earlier variables are gone]"
            )
        else:
            run.out.notice("[the Python kernel did not stop on interrupt; a fresh one was started]")
        self.restart_kernel(run.out)
        if stuck:
            self.finish(run, "exec-timeout", None)
        else:
            self.finish(run, "finished", died)

    def query_exit_code(self, run):
        """0, 1 after an exception, or the code of a SystemExit (ipykernel swallows it)."""
        reply = run.reply
        if reply.get("status") == "ok":
            return 0
        if reply.get("ename") != "SystemExit":
            return 1
        value = str(reply.get("evalue") or "")
        if value in ("", "None"):
            return 0
        try:
            code = int(value)
        except ValueError:
            run.out.text("stderr", value + "\n")  # like python: the message, then status 1
            return 1
        return code if -(2**31) <= code < 2**31 else 1

    # --- a batch: shell commands ------------------------------------------------------------

    def next_step(self, run):
        while run.steps:
            run.step, command = run.steps.pop(0)
            if command:
                self.start_step(run, command)
                return
        self.finish(run, "finished", 0)

    def start_step(self, run, command):
        try:
            run.proc = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own group: an interrupt reaches its children
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the command
            run.out.text("stderr", f"cannot run the {run.step} command: {exc}\n")
            self.finish(run, "finished", 127)
            return
        run.exited_at = None
        for pipe, kind in ((run.proc.stdout, "stdout"), (run.proc.stderr, "stderr")):
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            run.pipes[pipe.fileno()] = (pipe, kind, decoder)
            self.poller.register(pipe.fileno(), self.zmq.POLLIN)

    def read_pipe(self, run, fd):
        pipe, kind, decoder = run.pipes[fd]
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if data:
            run.out.text(kind, decoder.decode(data))
            return
        run.out.text(kind, decoder.decode(b"", final=True))
        self.close_pipe(run, fd)

    def close_pipe(self, run, fd):
        pipe = run.pipes.pop(fd)[0]
        self.poller.unregister(fd)
        pipe.close()

    def tick_batch(self, run, now):
        proc = run.proc
        if proc is None:
            return
        if run.timed_out_at is not None and now - run.timed_out_at > KILL_GRACE:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        code = proc.poll()
        if code is None:
            return
        if run.pipes:  # output still open: a background job may hold it; wait a little
            run.exited_at = run.exited_at or now
            if now - run.exited_at < PIPE_GRACE:
                return
            for fd in list(run.pipes):
                self.close_pipe(run, fd)
        run.proc = None
        status = exit_status(code)
        if run.timed_out_at is not None:
            self.finish(run, "exec-timeout", None)
        elif run.step == "build" and status == 0:
            self.next_step(run)
        else:
            interrupted = run.interrupted and status != 0
            self.finish(run, "finished", status, "KeyboardInterrupt" if interrupted else None)

    def shutdown(self):
        run = self.run
        if run is not None and run.proc is not None:
            try:
                os.killpg(run.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.stop_kernel()


def private_dir():
    """A new directory only this user can enter (0700): the kernel's sockets live there.
    Unix socket paths hold at most 107 bytes, so a short parent is preferred."""
    parents = [tempfile.gettempdir(), "/tmp", "/dev/shm", os.getcwd()]
    for parent in parents:
        if len(parent) <= SOCKET_DIR_MAX and os.access(parent, os.W_OK | os.X_OK):
            return tempfile.mkdtemp(prefix="bai-runner-", dir=parent)
    return tempfile.mkdtemp(prefix="bai-runner-")


def write_kernel_spec(workdir):
    """A kernel spec for this python, found through JUPYTER_PATH (the runner's only)."""
    folder = os.path.join(workdir, "kernels", KERNEL_NAME)
    os.makedirs(folder)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {
        "argv": [*argv, "--HistoryManager.enabled=False"],
        "display_name": "Python 3",
        "language": "python",
        "interrupt_mode": "signal",
    }
    with open(os.path.join(folder, "kernel.json"), "w") as f:
        json.dump(spec, f)
    os.environ["JUPYTER_PATH"] = workdir


def main():
    missing = [m for m in ("zmq", "jupyter_client", "ipykernel") if not importlib.util.find_spec(m)]
    if missing:
        send({"type": "unavailable", "reason": f"{sys.executable} lacks {', '.join(missing)}"})
        return
    workdir = private_dir()
    runner = Runner(workdir)
    try:
        write_kernel_spec(workdir)
        runner.start_kernel()
    except Exception as exc:  # noqa: BLE001 - whatever stops the kernel, the agent is told
        send({"type": "unavailable", "reason": f"the kernel did not start: {exc}"})
        runner.shutdown()
        return
    send({"type": "ready"})
    try:
        runner.serve()
    finally:
        runner.shutdown()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (zmq and jupyter_client complain in __del__)
