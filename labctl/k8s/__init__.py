"""The lab and Kubernetes: its job exported as a Kubeflow TrainJob or a JobSet (export), and such
a manifest run on the lab's nodes as Kubernetes would run it (manifest, pods, jobs); schema holds
the two APIs' fields, types and required keys."""
