#!/bin/sh
# Entry point of every lab node (copied into the image): report what this node runs, then
# become the idle host process given as the command. `labctl up` waits for the READY line.
#
# It checks that the node's Python finds the torch package and reads its version from
# torch/version.py, which takes milliseconds. A full `import torch` costs about 2 CPU-seconds and
# is the same on every node of one image, so the image build does that once (see the Dockerfile)
# instead of every node at every start: 16 nodes on 2 cores would otherwise wait about 16 s.
#
# With DDPLAB_SSH_AUTHORIZED_KEY set (`labctl up --ssh`), the node is also an SSH host: sshd runs
# as the node's own user (no capability, no root needed), accepts that one key, and the node's
# host key, made here at first start as a machine makes its own, is announced on a
# DDPLAB_SSH_HOSTKEY line that labctl reads through the engine to write known_hosts.

# The image's precompiled C++ header for torch.compile (see the Dockerfile), linked where inductor
# looks for it: /tmp/torchinductor_<user>/precompiled_headers, <user> as Python's getpass.getuser()
# reads it (LOGNAME, USER, LNAME, USERNAME, the passwd entry, else uid_<uid>). A node without the
# link (an image built before it, a job's user other than the node's) makes its own, as torch does.
link_inductor_headers() {
  [ -d /opt/inductor-headers ] || return 0
  name=${LOGNAME:-${USER:-${LNAME:-${USERNAME:-}}}}
  [ -n "$name" ] || name=$(id -un 2>/dev/null) || name=uid_$(id -u)
  mkdir -p "/tmp/torchinductor_$name" || return 0
  [ -e "/tmp/torchinductor_$name/precompiled_headers" ] || ln -s /opt/inductor-headers "/tmp/torchinductor_$name/precompiled_headers"
}

start_sshd() {
  uid=$(id -u)
  nss=""
  entry=$(getent passwd "$uid")
  if [ -n "$entry" ]; then
    user=${entry%%:*}
    home=$(echo "$entry" | cut -d: -f6)
  else
    # The node runs as the invoking user's uid, which the image has never heard of: nss_wrapper
    # lends sshd a passwd entry for it, which a non-root process cannot write to /etc/passwd.
    user=ddplab
    home=/tmp/ddplab-home
    mkdir -p -m 700 "$home"
    { cat /etc/passwd; echo "$user:x:$uid:$(id -g):ddplab:$home:/bin/sh"; } > /tmp/ddplab-passwd
    { cat /etc/group; echo "$user:x:$(id -g):"; } > /tmp/ddplab-group
    nss="env LD_PRELOAD=libnss_wrapper.so NSS_WRAPPER_PASSWD=/tmp/ddplab-passwd NSS_WRAPPER_GROUP=/tmp/ddplab-group"
  fi
  dir=$home/.ddplab-sshd
  mkdir -p -m 700 "$dir" "$home/.ssh" || return 1
  [ -f "$dir/ssh_host_ed25519_key" ] || $nss ssh-keygen -q -t ed25519 -N "" -C "$(hostname)" -f "$dir/ssh_host_ed25519_key" || return 1
  printf '%s\n' "$DDPLAB_SSH_AUTHORIZED_KEY" > "$home/.ssh/authorized_keys" && chmod 600 "$home/.ssh/authorized_keys"
  cat > "$dir/sshd_config" <<EOF
Port 22
HostKey $dir/ssh_host_ed25519_key
PidFile $dir/sshd.pid
AuthorizedKeysFile .ssh/authorized_keys
AllowUsers $user
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
PrintMotd no
MaxStartups 64:30:128
EOF
  $nss /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log" || return 1
  LOGNAME=$user link_inductor_headers  # an SSH session's user is $user
  echo "DDPLAB_SSH_HOSTKEY user=$user $(cut -d' ' -f1,2 "$dir/ssh_host_ed25519_key.pub")"
}

link_inductor_headers

if [ -n "${DDPLAB_SSH_AUTHORIZED_KEY:-}" ]; then
  start_sshd || { echo "DDPLAB_NOT_READY: sshd did not start: $(tail -n 3 "${dir:-/tmp}/sshd.log" 2>/dev/null)"; exit 1; }
fi

# With DDPLAB_SLURM_DIR set (`labctl up --scheduler slurm`), the node is also a Slurm node.
if [ -n "${DDPLAB_SLURM_DIR:-}" ]; then
  /opt/ddplab/slurm-node.sh || exit 1
fi

python - <<'PY' || exit 1
import importlib.util, platform, re, sys
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    sys.exit("DDPLAB_NOT_READY: this node's Python cannot find torch")
with open(spec.submodule_search_locations[0] + "/version.py") as f:
    version = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read()).group(1)
print(f"DDPLAB_READY torch={version} python={platform.python_version()}", flush=True)
PY
exec "$@"
