package readme

import (
	"context"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// RedeliveryLimit is docs/redelivery-limit.md's listener.
func RedeliveryLimit(ctx context.Context, url string, topo dlx.Topology, toDLQ middleware.Recoverer, handle middleware.Handler) error {
	l, err := listener.New("orders", middleware.Chain(middleware.Retry(5), middleware.Recover(toDLQ)), handle,
		listener.WithURL(url), listener.WithDeclare(topo.Declare), // topo.Type: dlx.Quorum
		listener.WithRedeliveryLimit(5))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}
