// Package clustertest runs tests against the three-node RabbitMQ cluster of
// scripts/cluster.sh: start it with `make cluster-up`, export its URLs as
// $AMQPRETRY_CLUSTER_URLS (`make test-cluster` does both, and takes it down
// after), and call Require(t) at the top of a cluster test.
//
// URLs()[i] reaches node Nodes[i]. Run(t, "kill", "n2") and
// Run(t, "partition", "n2") disrupt a node through the script and undo it
// when the test ends, passed or failed: the cleanup heals what the test
// partitioned, starts what it killed, and waits until the cluster again has
// three running members, so the next test starts from a whole cluster.
// Leader(t, queue) names the node that leads a quorum queue.
//
// Without $AMQPRETRY_CLUSTER_URLS a cluster test skips, or fails when
// AMQPRETRY_REQUIRE_CLUSTER=1. The script needs root.
package clustertest
