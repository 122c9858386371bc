"""A launch carries the network its node's env file names (labctl.run.launch.network_env), so a run
moved onto an overlay's tunnel (labctl.net.overlay.envs_on) does not fall back to the container's copy."""

from labctl.run.launch import LaunchOptions, build_launches

ENV = {"MASTER_ADDR": "100.64.0.1", "MASTER_PORT": "29500", "PET_RDZV_ENDPOINT": "100.64.0.1:29500",
       "GLOO_SOCKET_IFNAME": "tailscale0", "NCCL_SOCKET_IFNAME": "tailscale0", "NPROC_PER_NODE": "1"}


def test_every_launcher_carries_the_sockets_interface_and_the_rendezvous_of_the_env_file():
    for launcher in ("torchrun", "warm", "static"):
        launches = build_launches({"node0": ENV, "node1": ENV}, ["x.py"], LaunchOptions(launcher=launcher),
                                  run_id="r", run_dir="/tmp/r")
        for launch in launches:
            assert launch.env["GLOO_SOCKET_IFNAME"] == launch.env["NCCL_SOCKET_IFNAME"] == "tailscale0", launcher
            assert launch.env["PET_RDZV_ENDPOINT"] == "100.64.0.1:29500", launcher
