module github.com/amqpretry/amqpretry

go 1.24

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/rabbitmq/amqp091-go v1.16.0
)

require go.uber.org/goleak v1.3.0 // indirect
