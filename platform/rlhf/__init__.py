"""The RLHF data plane (`stalwart.rlhf`): how an RLHF job's roles exchange data without etcd.

    actor ──weights (versioned, whole or nothing)──► rollouts
    actor ◄──ready groups── relay ◄──scores── reward
                             ▲   ◄──ref log-probs── reference
                             └──generated groups── rollouts

The actor asks the relay for the prompts of its next steps (from the deterministic data loader); the
relay hands them to rollouts, then the generated groups to reward and reference workers, under
leases tied to each worker's connection, and keeps what is ready for the actor, within a bounded
buffer. A group lost with a worker goes back to the stage that lost it, so it is generated again
from the same prompt; results from a lease that was given away are dropped, so nothing is counted
twice. Endpoints are found through etcd keys (`stalwart.store.keys.dataplane_endpoint`); the data
itself goes over plain TCP between the roles.

Modules: `messages` (what crosses the wire), `lineage` (which weight versions are still history),
`relay` (the relay's state machine), `relay_server` (`python -m stalwart.rlhf.relay_server`),
`relay_client`, `weights` (the actor's weight publisher and the rollouts' subscriber), `endpoints`,
`wire`, `server`, `connection`, `contract` (the workers' environment), `cursor` (the actor's
checkpointed relay position) and `ledger` (what the actor trained on, and the exactly-once check).
Nothing here imports torch at import time except `weights`, so the relay runs without it.
"""
