# Shared set-up steps for scripts/run and scripts/test (sourced, not run).
# Each step is idempotent: it checks first and only installs/starts what is missing.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
VAR="$ROOT/var"
mkdir -p "$VAR"

# Bold only on a terminal, and never under NO_COLOR (https://no-color.org).
say() {
  if [ -t 2 ] && [ -z "${NO_COLOR:-}" ]; then printf '\033[1m==> %s\033[0m\n' "$*" >&2
  else printf '==> %s\n' "$*" >&2; fi
}
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

APT_UPDATED=""
apt_install() {
  # apt_install <command-or-path-to-test> <package>...
  local probe="$1"; shift
  if command -v "$probe" >/dev/null 2>&1 || [ -e "$probe" ]; then return 0; fi
  [ "$(id -u)" = 0 ] || die "$* is not installed and this is not root: install it ($*) or set the matching URL"
  say "installing $* (Debian packages)"
  if [ -z "$APT_UPDATED" ]; then apt-get update -qq >/dev/null; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_venv() {
  local py="${PYTHON:-python3}"
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating the virtualenv in .venv"
    "$py" -m venv "$VENV"
  fi
  local stamp="$VENV/.requirements.sha"
  local want
  want="$(cat "$ROOT/requirements.txt" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing Python packages (requirements.txt, pinned by constraints.txt)"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/requirements.txt" -c "$ROOT/constraints.txt"
    echo "$want" > "$stamp"
  fi
  local bai_stamp="$VENV/.bai.sha" bai_want
  bai_want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
  if [ ! -x "$VENV/bin/bai" ] || [ "$(cat "$bai_stamp" 2>/dev/null)" != "$bai_want" ]; then
    # The `bai` console script (bai_client/ and bai_common/), editable and offline: the
    # venv has setuptools. Again when pyproject.toml changes (its packages, its scripts).
    say "installing the bai command"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
    echo "$bai_want" > "$bai_stamp"
  fi
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
}

ensure_node_modules() {
  # xterm.js comes from npm at install time and is never committed.
  if [ -f "$ROOT/package.json" ]; then
    local stamp="$ROOT/node_modules/.package-lock.sha"
    local want
    want="$(cat "$ROOT/package.json" "$ROOT/package-lock.json" 2>/dev/null | sha256sum | cut -c1-16)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
      command -v npm >/dev/null || apt_install npm npm
      say "installing front-end packages (npm ci)"
      (cd "$ROOT" && npm ci --silent --no-audit --no-fund >/dev/null)
      echo "$want" > "$stamp"
    fi
  fi
}

pg_ready() { pg_isready -q -h 127.0.0.1 -p "${1:-5432}" 2>/dev/null; }

ensure_postgres() {
  # Uses $DATABASE_URL when set; else a local PostgreSQL (installed and started if needed).
  if [ -n "${DATABASE_URL:-}" ]; then return 0; fi
  apt_install pg_ctlcluster postgresql postgresql-client
  if ! pg_ready; then
    say "starting PostgreSQL"
    local version
    version="$(ls /usr/lib/postgresql | sort -V | tail -1)"
    if ! pg_lsclusters -h 2>/dev/null | grep -q .; then
      pg_createcluster "$version" main >/dev/null
    fi
    pg_ctlcluster "$version" main start 2>/dev/null || service postgresql start >/dev/null
    for _ in $(seq 1 50); do pg_ready && break; sleep 0.2; done
    pg_ready || die "PostgreSQL did not start"
  fi
  if ! su postgres -c "psql -tAc \"select 1 from pg_roles where rolname='bai'\"" | grep -q 1; then
    su postgres -c "psql -q -c \"create role bai login superuser password 'bai'\"" >/dev/null
  fi
  if ! su postgres -c "psql -tAc \"select 1 from pg_database where datname='bai'\"" | grep -q 1; then
    su postgres -c "createdb -O bai bai" >/dev/null
  fi
  export DATABASE_URL="postgres://bai:bai@127.0.0.1:5432/bai"
}

redis_password() {
  # The password of the Redis this checkout starts itself, made once into var/ (0600),
  # like the secret key: printed, never put on a command line.
  local file="$VAR/redis_password"
  if [ ! -s "$file" ]; then
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$file.$$" && mv "$file.$$" "$file")
  fi
  chmod 600 "$file"
  cat "$file"
}

redis_answers() { # redis_answers PORT PASSWORD: whether a Redis there asks for this password
  redis-cli -h 127.0.0.1 -p "$1" ping 2>&1 | grep -q NOAUTH \
    && REDISCLI_AUTH="$2" redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG
}

ensure_redis() {
  # Uses $REDIS_URL when set (a Redis someone else runs: left alone as it is). Else a local
  # redis-server that asks for the password in var/redis_password, on $BAI_TEST_REDIS_PORT
  # (6379), or on a free port when another Redis, not ours, already holds that one.
  if [ -n "${REDIS_URL:-}" ]; then return 0; fi
  apt_install redis-server redis-server
  local password port="${BAI_TEST_REDIS_PORT:-6379}"
  password="$(redis_password)"
  if ! redis_answers "$port" "$password"; then
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
      say "another Redis holds 127.0.0.1:${BAI_TEST_REDIS_PORT:-6379}: starting ours on $port"
    fi
  fi
  if ! redis_answers "$port" "$password"; then
    say "starting Redis on 127.0.0.1:$port (password in var/redis_password)"
    # The password goes in on stdin as a config line, never on the command line.
    printf 'requirepass %s\n' "$password" | redis-server - --port "$port" --bind 127.0.0.1 \
      --daemonize yes --save "" --appendonly no --logfile "$VAR/redis-$port.log" >/dev/null
    for _ in $(seq 1 50); do redis_answers "$port" "$password" && break; sleep 0.1; done
    redis_answers "$port" "$password" || die "Redis did not start (see var/redis-$port.log)"
  fi
  export REDIS_URL="redis://:$password@127.0.0.1:$port/0"
}

docker_ready() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

ensure_docker() {
  if docker_ready; then return 0; fi
  apt_install dockerd docker.io
  [ "$(id -u)" = 0 ] || die "no Docker engine answers and this is not root to start one"
  say "starting the Docker engine (dockerd)"
  (nohup dockerd >"$VAR/dockerd.log" 2>&1 &)
  for _ in $(seq 1 100); do docker_ready && return 0; sleep 0.2; done
  die "dockerd did not start (see var/dockerd.log)"
}

ensure_chromium() { apt_install /usr/bin/chromium chromium; }
ensure_image_tools() { apt_install debootstrap debootstrap; apt_install /bin/busybox busybox-static; }
# OpenSSH's sftp and scp: the SFTP session tests drive our server with the standard client.
ensure_ssh_client() { apt_install /usr/bin/sftp openssh-client; apt_install /usr/bin/scp openssh-client; }
ensure_haproxy() { apt_install haproxy haproxy; }
# Process kernels run in bubblewrap sandboxes (agent/backends/sandbox.py); nsenter and
# unshare come with util-linux.
ensure_bwrap() { apt_install bwrap bubblewrap; apt_install nsenter util-linux; }

# The run command's children: start each in the background and add its pid to
# SUPERVISED; `supervise_wait` then waits until one exits or the run is told to stop.
# Ctrl-C (SIGINT) or SIGTERM: "stopping", every child is stopped, exit 0 (a stop
# asked for is no failure). A child that exits on its own: said, the others are
# stopped, exit 1. Call `supervise_traps` before starting anything.
SUPERVISED=()
supervise_stop() {
  trap - INT TERM EXIT
  local pid
  for pid in "${SUPERVISED[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
supervise_traps() {
  trap 'say "stopping"; supervise_stop; exit 0' INT TERM
  trap supervise_stop EXIT
}
supervise_wait() {
  wait -n "${SUPERVISED[@]}" || true
  say "a component exited on its own; stopping the others (see the logs in var/)"
  supervise_stop
  exit 1
}
