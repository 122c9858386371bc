# Start a node's fork server in the background (labctl.run.warm.server_argv):
#   sh -c TEXT FORKSERVER_TEXT SOCKET_PATH WORKER_TEXT CHILD_TEXT [PRELOAD...] [-- LATER...]
# Every server whose command line is not this one ends first: another labctl's (another socket), or
# this labctl's with other modules to preload, waited for until it has gone, since it holds the same
# socket. Then `nohup ... &` with every stream redirected: the exec (docker exec, an SSH session)
# returns at once and the server lives on in the node. A server of this very command line already
# answering makes the new one exit (RUNNING), so starting twice starts one; where one of this command
# line already runs, none is started at all, so that no second one lives on for the moment it takes
# to find that out. A run's workers share their server's command line (fork keeps it): a match whose
# parent matches too is a worker, never a server.
mkdir -p "$(dirname "$1")" || exit 1
want=$(printf '%s\0' python -c "$0" serve "$@" | cksum)
running=""
matches=$(pgrep -f 'serve /tmp/ddplab/fork-[0-9a-f]+[.]sock')
for pid in $matches; do
  parent=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null)
  case " $(echo $matches) " in *" $parent "*) continue ;; esac
  if [ "$(cat "/proc/$pid/cmdline" 2>/dev/null | cksum)" = "$want" ]; then running=1; continue; fi
  kill "$pid" 2>/dev/null
  i=0
  while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
done
[ -n "$running" ] && exit 0
log=/tmp/ddplab/fork.log
nohup python -c "$0" serve "$@" </dev/null >>"$log" 2>&1 &
