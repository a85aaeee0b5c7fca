package readme

import (
	"context"
	"time"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// BrokerRetryTiers is docs/broker-retry.md's TTL tiers.
func BrokerRetryTiers(ctx context.Context, url string, pub *publisher.Publisher, handle middleware.Handler) error {
	topo := dlx.Topology{
		Queue:       "payments",
		RetryDelays: []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute},
	}
	chain := middleware.Chain(
		middleware.Retry(5, middleware.HandOffAfter(5*time.Second)), // 1s, 2s, 4s in memory
		middleware.Recover(topo.Tiers(pub, dlx.MaxRetries(5))),      // then 10s, 1m, 10m, 10m, 10m
	)
	l, err := listener.New("payments", chain, handle, listener.WithURL(url), listener.WithDeclare(topo.Declare))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// BrokerRetrySingleDelay is docs/broker-retry.md's single-delay layout: the
// chain that takes the last retry and Permanent errors out of the
// reject-to-retry loop.
func BrokerRetrySingleDelay(pub *publisher.Publisher) middleware.Middleware {
	topo := dlx.Topology{Queue: "payments", SingleRetryDelay: 30 * time.Second}
	final := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())
	chain := middleware.Chain(middleware.Retry(3), middleware.Recover(topo.RejectToRetry(5, final)))
	return chain
}

// BrokerRetryDelayedRedelivery is docs/broker-retry.md's RabbitMQ 4.3
// delayed redelivery.
func BrokerRetryDelayedRedelivery(ctx context.Context, url string, pub *publisher.Publisher, handle middleware.Handler) error {
	topo := dlx.Topology{
		Queue: "payments", Type: dlx.Quorum,
		DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 5, Min: 10 * time.Second, Max: time.Minute},
	}
	chain := middleware.Chain(
		middleware.Retry(3),                     // 1s, 2s in memory
		middleware.Recover(topo.Redeliver(pub)), // then the broker: 10s, 20s, 30s, 40s, 50s, then the DLQ
	)
	l, err := listener.New("payments", chain, handle, listener.WithURL(url), listener.WithDeclare(topo.Declare))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}
