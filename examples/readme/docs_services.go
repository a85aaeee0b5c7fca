package readme

import (
	"context"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// Group is docs/services.md's two queues in one listener.Group.
func Group(ctx context.Context, url string, chain middleware.Middleware, handleOrder, handleRefund middleware.Handler,
	ordersTopo, refundsTopo dlx.Topology, errc chan<- error) error {
	orders, _ := listener.New("orders", chain, handleOrder, listener.WithDeclare(ordersTopo.Declare))
	refunds, _ := listener.New("refunds", chain, handleRefund, listener.WithDeclare(refundsTopo.Declare))
	g, err := listener.NewGroup([]*listener.Listener{orders, refunds}, listener.WithURL(url), listener.WithFailFast())
	if err != nil {
		return err
	}
	go func() { errc <- g.Run(ctx) }()
	err = g.WaitReady(ctx) // consuming: the broker shows the consumers
	return err
}
