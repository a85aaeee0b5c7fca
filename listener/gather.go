package listener

// The gathering stage of NewBatch: a channel's reader collects deliveries
// into a batch (collect), which then takes the pipeline's path as one
// handler call in one slot of the pool (batch.go: runBatch); with a pool of
// several slots the batch runs off the reader while the next is collected.

// spawnFailures starts a goroutine that runs the rest of a detached
// batch's failures.
func (c *consumer) spawnFailures(run *batchRun) {
	c.sv.consumers.Add(1)
	go func() {
		defer c.sv.consumers.Done()
		c.runFailures(run)
	}()
}

// spawnBatchReader starts a goroutine that runs the rest of pending's
// failures (if pending is not nil), then reads batches.
func (c *consumer) spawnBatchReader(pending *batchRun) {
	c.sv.consumers.Add(1)
	go c.readBatches(pending)
}

// readBatches is read for batch mode.
func (c *consumer) readBatches(pending *batchRun) {
	defer c.sv.consumers.Done()
	if pending != nil && !c.runFailures(pending) {
		return // one of them parked: another goroutine goes on
	}
	for {
		run, open := c.collect()
		if run != nil && open && c.sv.l.pool.parallel() {
			// Several batches may run at once: this goroutine runs this
			// one, a new one reads the next.
			run.detached = true
			first := run.dds[0]
			c.parked.park(first, &first.fate.link) // the oldest, for the age watch
			c.spawnBatchReader(nil)
			c.runBatch(run)
			return
		}
		if run != nil && !c.runBatch(run) {
			return
		}
		if !open {
			break
		}
	}
	c.finish()
}

// collect reads the next batch: it waits for a first delivery, then takes
// what arrives until the batch is full, the wait has passed since the first,
// the consumer can receive no more (every prefetch slot taken), or it is
// interrupted. open is false once the deliveries channel has closed; run is
// nil when nothing was collected.
func (c *consumer) collect() (run *batchRun, open bool) {
	b := c.b
	for run == nil {
		d, at, ok := c.next()
		if !ok {
			return nil, false
		}
		if dd := c.admit(&d, at); dd != nil {
			run = &batchRun{c: c, dds: make([]*delivery, 0, b.size)}
			run.add(dd)
		}
	}
	if len(run.dds) >= b.size {
		return run, true
	}
	prefetch := int64(c.prefetch)
	if b.wait == 0 {
		for len(run.dds) < b.size && c.inFlight.Load() < prefetch {
			d, at, ok, closed := c.ahead.take()
			if !ok {
				return run, !closed
			}
			if dd := c.admit(&d, at); dd != nil {
				run.add(dd)
			}
		}
		return run, true
	}
	b.timer.Reset(b.wait)
	defer b.timer.Stop()
	for len(run.dds) < b.size && c.inFlight.Load() < prefetch {
		d, at, ok, closed := c.ahead.take()
		if ok {
			if dd := c.admit(&d, at); dd != nil {
				run.add(dd)
			}
			continue
		}
		if closed {
			return run, false
		}
		select {
		case <-c.ahead.ready: // one arrived (or the deliveries closed): take it
		case <-b.timer.C:
			return run, true
		case <-c.interrupt: // shutdown or a trip: the batch goes back (enter refuses it)
			return run, true
		case <-c.ctx.Done(): // the channel died
			return run, true
		}
	}
	return run, true
}

func (run *batchRun) add(dd *delivery) {
	r := dd.recovery()
	r.batch, r.index = run, len(run.dds)
	run.dds = append(run.dds, dd)
	run.c.b.collecting.Add(1)
}
