package console

import (
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
)

// What a delete writes on the archived copy, after the recoverer's header
// prefix; a restore removes them again. Every other header stays as it was.
const (
	SuffixArchivedAt   = "archived-at"   // RFC 3339, UTC
	SuffixArchivedBy   = "archived-by"   // the audit log's who
	SuffixArchivedFrom = "archived-from" // the queue it was deleted from, where a restore sends it
)

// ArchiveSuffix ends the name of a queue's archive: a delete moves dead
// letters from q to q.archive.
const ArchiveSuffix = ".archive"

// ArchiveOf is the archive of queue.
func ArchiveOf(queue string) string { return queue + ArchiveSuffix }

// IsArchive reports whether queue is named as an archive.
func IsArchive(queue string) bool { return strings.HasSuffix(queue, ArchiveSuffix) }

// ArchiveOptions move what dlx.Replay takes from queue to its archive with
// every header (dlx.ReplayAsIs), stamped with when, by whom and from where.
func ArchiveOptions(prefix, queue, by string, now time.Time) []dlx.ReplayOption {
	return []dlx.ReplayOption{dlx.ReplayTo(ArchiveOf(queue)), dlx.ReplayAsIs(func(_ *amqp.Delivery, h amqp.Table) {
		h[prefix+SuffixArchivedAt] = now.UTC().Format(time.RFC3339)
		h[prefix+SuffixArchivedBy] = by
		h[prefix+SuffixArchivedFrom] = queue
	})}
}

// RestoreOptions send what dlx.Replay takes from an archive back to the
// queue each message was archived from, without the archive's headers; a
// message without SuffixArchivedFrom stays in the archive.
func RestoreOptions(prefix string) []dlx.ReplayOption {
	return []dlx.ReplayOption{dlx.ReplayToHeader(prefix + SuffixArchivedFrom), dlx.ReplayAsIs(func(_ *amqp.Delivery, h amqp.Table) {
		for _, s := range []string{SuffixArchivedAt, SuffixArchivedBy, SuffixArchivedFrom} {
			delete(h, prefix+s)
		}
	})}
}

// DeclareArchive makes sure queue's archive exists before anything is
// moved there: published to a queue that is not there, a copy would be
// confirmed and dropped. An archive that exists is used as it is, whatever
// its type and arguments (declare it beforehand to choose them); one that
// does not is declared durable, of queueType ("classic" or "quorum").
// AMQP 0-9-1 does not tell a client a queue's type (a passive declare
// answers with counts only, and a probing declaration is refused over the
// first other argument that differs), so the caller says it: the console's
// and the CLI's --archive-type. open gives a fresh channel each time, since
// a passive declare of a missing queue closes its channel.
func DeclareArchive(open func() (*amqp.Channel, error), queue, queueType string) error {
	archive := ArchiveOf(queue)
	ch, err := open()
	if err != nil {
		return err
	}
	_, err = ch.QueueDeclarePassive(archive, true, false, false, false, nil)
	_ = ch.Close()
	var amqpErr *amqp.Error
	if err == nil || !errors.As(err, &amqpErr) || amqpErr.Code != amqp.NotFound {
		if err != nil {
			return fmt.Errorf("check the archive %s: %w", archive, err)
		}
		return nil
	}
	if queueType == "" {
		queueType = "classic"
	}
	if queueType != "classic" && queueType != "quorum" {
		return fmt.Errorf("the archive's type must be classic or quorum, got %q", queueType)
	}
	if ch, err = open(); err != nil {
		return err
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(archive, true, false, false, false, amqp.Table{"x-queue-type": queueType}); err != nil {
		return fmt.Errorf("declare the archive %s (%s): %w; nothing was deleted", archive, queueType, err)
	}
	return nil
}
