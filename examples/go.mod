module github.com/amqpretry/amqpretry/examples

go 1.24

require (
	github.com/amqpretry/amqpretry v0.0.0
	github.com/rabbitmq/amqp091-go v1.16.0
	go.uber.org/goleak v1.3.0
)

require github.com/cenkalti/backoff/v4 v4.3.0 // indirect

replace github.com/amqpretry/amqpretry => ../
