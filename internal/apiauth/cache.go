package apiauth

import (
	"container/list"
	"crypto/sha256"
	"sync"
	"time"
)

// cache keeps at most size decisions, each until it expires; when full, the
// least recently used goes.
type cache struct {
	size int

	mu    sync.Mutex
	order *list.List // of *entry, most recently used first
	index map[[sha256.Size]byte]*list.Element
}

type entry struct {
	key     [sha256.Size]byte
	d       decision
	expires time.Time
}

func newCache(size int) *cache {
	return &cache{size: size, order: list.New(), index: map[[sha256.Size]byte]*list.Element{}}
}

// get returns the decision kept for key, unless it expired by now.
func (c *cache) get(key [sha256.Size]byte, now time.Time) (decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.index[key]
	if !ok {
		return decision{}, false
	}
	e := el.Value.(*entry)
	if !now.Before(e.expires) {
		c.order.Remove(el)
		delete(c.index, key)
		return decision{}, false
	}
	c.order.MoveToFront(el)
	return e.d, true
}

// put keeps d for key until expires.
func (c *cache) put(key [sha256.Size]byte, d decision, expires time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.index[key]; ok {
		e := el.Value.(*entry)
		e.d, e.expires = d, expires
		c.order.MoveToFront(el)
		return
	}
	for c.order.Len() >= c.size {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.index, last.Value.(*entry).key)
	}
	c.index[key] = c.order.PushFront(&entry{key: key, d: d, expires: expires})
}
