#!/usr/bin/env bash
# A rootless Docker engine of its own user, for tests/integration/test_rootless.py.
#
#   rootless-docker.sh start DIR   install what is missing (root on Debian), start the engine; prints
#                                  "socket=unix://... uid=N user=NAME home=DIR" on its last line
#   rootless-docker.sh stop DIR    stop it and put /dev/net/tun's mode back
#
# The recipe, measured on our machines (Debian 12, cgroup v1, no systemd): Debian's docker.io ships
# dockerd-rootless.sh; it needs rootlesskit, uidmap (newuidmap) and slirp4netns, a user with
# subordinate uids (useradd writes them), and /dev/net/tun openable by that user (it is 0600 here,
# and slirp4netns then fails with "open: Permission denied"). setpriv, not runuser: runuser kills
# the whole tree with SIGKILL when the daemon is stopped. The daemon answers in about 0.5 s.
set -euo pipefail

USER_NAME=${DDPLAB_ROOTLESS_USER:-ddplab-rootless}
cmd=${1:?usage: rootless-docker.sh start|stop DIR}
dir=${2:?usage: rootless-docker.sh start|stop DIR}
say() { printf '[rootless] %s\n' "$*" >&2; }
die() { printf '[rootless] error: %s\n' "$*" >&2; exit 1; }

start() {
  [ "$(id -u)" = 0 ] || die "starting a rootless engine for a test user needs root (to add the user and packages)"
  if ! command -v rootlesskit >/dev/null || ! command -v newuidmap >/dev/null || ! command -v slirp4netns >/dev/null; then
    say "installing rootlesskit, uidmap and slirp4netns"
    # `make test` installs them before the tests (test-engines); alone, wait for another apt-get's lock
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq rootlesskit uidmap slirp4netns >/dev/null 2>&1 \
      || { apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null \
           && apt-get -o DPkg::Lock::Timeout=600 install -y -qq rootlesskit uidmap slirp4netns >/dev/null; }
  fi
  script=$(command -v dockerd-rootless.sh || true)
  [ -n "$script" ] || script=$(dpkg -L docker.io 2>/dev/null | grep '/dockerd-rootless.sh$' | head -n 1)
  [ -n "$script" ] || die "no dockerd-rootless.sh (Debian's docker.io ships it under /usr/share/docker.io/contrib)"
  id "$USER_NAME" >/dev/null 2>&1 || useradd -m -s /bin/sh "$USER_NAME"
  uid=$(id -u "$USER_NAME"); gid=$(id -g "$USER_NAME"); home=$(getent passwd "$USER_NAME" | cut -d: -f6)
  grep -q "^$USER_NAME:" /etc/subuid || die "$USER_NAME has no subordinate uids in /etc/subuid"
  mkdir -p "$dir"
  stat -c %a /dev/net/tun > "$dir/tun-mode"
  chmod 0666 /dev/net/tun
  install -d -o "$uid" -g "$gid" -m 700 "$dir/run"
  # Compose v2 is a CLI plugin of root's (make engine installs it): the user's docker CLI needs it too.
  plugin=""
  for candidate in "${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins/docker-compose" /usr/libexec/docker/cli-plugins/docker-compose \
                   /usr/lib/docker/cli-plugins/docker-compose /usr/local/lib/docker/cli-plugins/docker-compose; do
    [ -x "$candidate" ] && { plugin=$candidate; break; }
  done
  [ -n "$plugin" ] || die "no docker-compose CLI plugin found for root (make engine installs one)"
  install -d -o "$uid" -g "$gid" "$home/.docker" "$home/.docker/cli-plugins"
  install -o "$uid" -g "$gid" -m 0755 "$plugin" "$home/.docker/cli-plugins/docker-compose"
  socket="unix://$dir/run/docker.sock"
  setsid setpriv --reuid="$uid" --regid="$gid" --init-groups -- env -i HOME="$home" USER="$USER_NAME" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin XDG_RUNTIME_DIR="$dir/run" \
    "$script" -H "$socket" > "$dir/dockerd.log" 2>&1 < /dev/null &
  echo $! > "$dir/dockerd.pid"
  for _ in $(seq 1 300); do
    if DOCKER_HOST=$socket docker info >/dev/null 2>&1; then
      say "rootless engine of $USER_NAME answers at $socket"
      echo "socket=$socket uid=$uid user=$USER_NAME home=$home"
      return
    fi
    sleep 0.1
  done
  tail -n 30 "$dir/dockerd.log" >&2 || true
  die "the rootless engine did not answer within 30 s; its log is above"
}

stop() {
  if [ -f "$dir/dockerd.pid" ]; then
    pid=$(cat "$dir/dockerd.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/dockerd.pid"
  fi
  [ -f "$dir/tun-mode" ] && chmod "$(cat "$dir/tun-mode")" /dev/net/tun && rm -f "$dir/tun-mode"
  return 0
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) die "unknown command $cmd (start or stop)" ;;
esac
