package readme

import (
	"context"

	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// KillSwitch is docs/kill-switch.md's listener.
func KillSwitch(ctx context.Context, url string, chain middleware.Middleware, handle middleware.Handler) error {
	l, err := listener.New("orders", chain, handle, listener.WithURL(url),
		listener.WithKillSwitch(listener.KillSwitch{}), // MassTransit's defaults: 15% of at least 10, restart after 1 min
	)
	if err != nil {
		return err
	}
	return l.Run(ctx)
}
