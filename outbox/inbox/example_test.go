package inbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // your program picks the PostgreSQL driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/outbox/inbox"
)

// The same message delivered twice takes effect once. In a consumer, pass
// the handler to listener.New; here it is called directly. It runs against
// PostgreSQL at $DATABASE_URL.
func ExampleInbox_Handler() {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx := context.Background()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	schema := "amqpretry_example_" + hex.EncodeToString(suffix)
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.charges (order_id text)`); err != nil {
		fmt.Println(err)
		return
	}
	defer db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)

	ib, err := inbox.New(db, inbox.WithTable(schema+".inbox"), inbox.WithConsumerName("billing"))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := ib.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	charge := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		fmt.Println("charging", d.MessageId)
		_, err := tx.ExecContext(ctx, `INSERT INTO `+schema+`.charges VALUES ($1)`, d.MessageId)
		return err
	})
	d := &amqp.Delivery{MessageId: "o-2", Body: []byte("order o-2")}
	fmt.Println("first delivery:", charge(ctx, d))
	fmt.Println("redelivery:", charge(ctx, d))
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM ` + schema + `.charges`).Scan(&n)
	fmt.Println("charges:", n)
	// Output:
	// charging o-2
	// first delivery: <nil>
	// redelivery: <nil>
	// charges: 1
}
