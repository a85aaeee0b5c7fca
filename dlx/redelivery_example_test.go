package dlx_test

import (
	"fmt"
	"time"

	"github.com/amqpretry/amqpretry/dlx"
)

// The broker's delayed retry waits Min·k before the k-th redelivery, capped
// at Max: a linear backoff, not an exponential one. On a broker older than
// RabbitMQ 4.3, FallbackToTiers lays out TTL tiers with the same waits.
func ExampleDelayedRedelivery() {
	topo := dlx.Topology{
		Queue: "payments",
		Type:  dlx.Quorum,
		DelayedRedelivery: &dlx.DelayedRedelivery{
			Redeliveries:    5,
			Min:             10 * time.Second,
			Max:             30 * time.Second,
			FallbackToTiers: true,
		},
	}
	fmt.Println("waits:", topo.DelayedRedelivery.Schedule())
	tiers := topo.TierEquivalent()
	for _, d := range tiers.RetryDelays {
		fmt.Println("fallback tier:", tiers.RetryQueue(d))
	}
	// Output:
	// waits: [10s 20s 30s 30s 30s]
	// fallback tier: payments.retry.10s
	// fallback tier: payments.retry.20s
	// fallback tier: payments.retry.30s
}
