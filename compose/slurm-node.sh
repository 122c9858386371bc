#!/bin/sh
# Start this node's part of the lab's Slurm cluster (`labctl up --scheduler slurm`), as root:
# munged, then slurmctld on the controller node, then slurmd. Called by node-entrypoint.sh before
# the node reports ready; prints one DDPLAB_NOT_READY line and fails when a daemon does not start.
# Run again on a running node (`labctl up` does), it starts only the daemons that are not running.
#
# From the environment (labctl/lab/compose.py, slurm_settings):
#   DDPLAB_SLURM_DIR         the lab's slurm.conf and munge.key (.lab/<lab>/slurm in the workspace)
#   DDPLAB_SLURM_CONTROLLER  the node that runs slurmctld (node0)
#   DDPLAB_RUN_AS            uid:gid of the person running labctl: Slurm starts job steps as them,
#                            and needs a passwd entry for that uid on every node
set -eu

dir=${DDPLAB_SLURM_DIR:?}
uid=${DDPLAB_RUN_AS%%:*}
gid=${DDPLAB_RUN_AS##*:}
node=$(hostname)

fail() {
  echo "DDPLAB_NOT_READY: slurm on $node: $*"
  exit 1
}

[ "$(id -u)" = 0 ] || fail "the node must run as root for slurmd and munged (it runs as uid $(id -u))"
if [ ! -r "$dir/slurm.conf" ] || [ ! -r "$dir/cgroup.conf" ] || [ ! -r "$dir/munge.key" ]; then
  fail "no slurm.conf, cgroup.conf or munge.key in $dir"
fi

# The job's user, as the cluster's directory service would provide it.
getent group "$gid" >/dev/null || echo "ddplab:x:$gid:" >> /etc/group
getent passwd "$uid" >/dev/null || echo "ddplab:x:$uid:$gid:ddplab lab user:/tmp:/bin/sh" >> /etc/passwd

# munge: the key only munge may read, as munged insists; the lab's copy stays in the workspace.
install -o munge -g munge -m 0400 "$dir/munge.key" /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged || fail "munged did not start"

# Debian's Slurm reads /etc/slurm/slurm.conf and cgroup.conf beside it: the lab's, linked, so
# `labctl up` rewriting them is seen. cgroup.conf names the cgroup/v1 plugin, the one slurmd 22.05
# can start with read-only cgroups, on a cgroup v1 or v2 host (labctl/slurm/conf.py).
ln -sf "$dir/slurm.conf" /etc/slurm/slurm.conf
ln -sf "$dir/cgroup.conf" /etc/slurm/cgroup.conf
install -d -m 0755 /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
if [ "$node" = "${DDPLAB_SLURM_CONTROLLER:?}" ] && ! pgrep -x slurmctld >/dev/null; then
  /usr/sbin/slurmctld || fail "slurmctld did not start: $(tail -n 3 /var/log/slurm/slurmctld.log 2>/dev/null)"
fi
if ! pgrep -x slurmd >/dev/null; then
  /usr/sbin/slurmd -N "$node" || fail "slurmd did not start: $(tail -n 3 /var/log/slurm/slurmd.log 2>/dev/null)"
fi
