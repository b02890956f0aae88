package state

import (
	"hash/maphash"
	"slices"

	"github.com/podres-proxy/podres-proxy/model"
)

// Decoding an allocator annotation can take a while (a hostile pod may
// list thousands of devices), and the store's write lock is what every
// query's reads wait on. So annotations are decoded before the lock is
// taken and the results are handed in: under the lock the store only
// swaps records. A set of results is keyed by the relevant annotations'
// content, so a sandbox that names its pod only by sandbox id finds its
// result too. Annotations the record already has are not decoded again;
// only a record whose annotations changed between that look and the lock
// (a race of two sources) or one loaded at Open is decoded under the lock.

// decoded is one decoding's result.
type decoded struct {
	rel  map[string]string
	devs []model.Device
	errs []string
}

// predecoded holds the results for one call's annotations.
type predecoded map[uint64][]*decoded

var annSeed = maphash.MakeSeed()

// annKey hashes relevant annotations independently of map order.
func annKey(rel map[string]string) uint64 {
	keys := make([]string, 0, len(rel))
	for k := range rel {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var h maphash.Hash
	h.SetSeed(annSeed)
	for _, k := range keys {
		h.WriteString(k)
		h.WriteByte(0)
		h.WriteString(rel[k])
		h.WriteByte(0)
	}
	return h.Sum64()
}

// relevant keeps the annotations the decoder reads.
func (s *Store) relevant(all map[string]string) map[string]string {
	var rel map[string]string
	for k, v := range all {
		if s.opts.Decoder.Relevant(k) {
			if rel == nil {
				rel = map[string]string{}
			}
			rel[k] = v
		}
	}
	return rel
}

// predecode decodes the relevant annotations of each pod, without the
// store's lock; ref names the pod in the decoder's errors.
func (s *Store) predecode(pre predecoded, ref model.PodRef, all map[string]string) {
	if s.opts.Decoder == nil {
		return
	}
	rel := s.relevant(all)
	if len(rel) == 0 {
		return
	}
	if ref.UID != "" {
		// Unchanged annotations are not decoded again (CRI reconciles list
		// every sandbox every 30 s): a look under the read lock is cheap.
		s.mu.RLock()
		r := s.byUID[ref.UID]
		same := r != nil && r.Provenance.Annotations != nil && mapsEqual(rel, r.Annotations)
		s.mu.RUnlock()
		if same {
			return
		}
	}
	k := annKey(rel)
	for _, d := range pre[k] {
		if mapsEqual(d.rel, rel) {
			return
		}
	}
	devs, errs := s.decodeRef(ref, rel)
	pre[k] = append(pre[k], &decoded{rel: rel, devs: devs, errs: errs})
}

// lookup returns the result for rel, if predecoded.
func (pre predecoded) lookup(rel map[string]string) (*decoded, bool) {
	for _, d := range pre[annKey(rel)] {
		if mapsEqual(d.rel, rel) {
			return d, true
		}
	}
	return nil, false
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
