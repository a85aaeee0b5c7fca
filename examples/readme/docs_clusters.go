package readme

import (
	"context"
	"time"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
)

// Cluster is docs/clusters.md's listener and publisher on three nodes.
func Cluster(ctx context.Context, handle middleware.Handler) error {
	nodes := []string{"amqp://app:secret@rabbit-1:5672/", "amqp://app:secret@rabbit-2:5672/", "amqp://app:secret@rabbit-3:5672/"}
	pub, err := publisher.New(nodes[0], publisher.WithURLs(nodes...))
	if err != nil {
		return err
	}
	topo := dlx.Topology{Queue: "orders", Type: dlx.Quorum, AtLeastOnce: true, RetryDelays: []time.Duration{10 * time.Second, time.Minute}}
	l, err := listener.New("orders", middleware.Chain(middleware.Retry(3), middleware.Recover(topo.Tiers(pub, dlx.MaxRetries(5)))), handle,
		listener.WithURLs(nodes...), listener.WithDeclare(topo.Declare))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}
