"""The agent in Kubernetes mode (`inferd agent --kubernetes`): it supervises no process.

- `discovery`: the engine pods on this node, from the API server (official client).
- `alert_pull`: the firing alerts about this node, pulled from Alertmanager's API v2.
- `node_remediation`: alerts about this node routed to one remediation policy per engine
  pod; deleting a stalled pod (`PodHost`) is the only action that is not an admin call.
- `pod_numa`: whether a pod's CPUs and memory sit on its GPUs' NUMA node.
- `node`: the loop that ties them together, its options, its collector and the agent hook.

docs/ADMIN.md ("Kubernetes mode") says how an alert is acted on once, on its own node.
"""
