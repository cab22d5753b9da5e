package extender

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// argsReader reads the ExtenderArgs of one /filter, /prioritize or
// /dra/prioritize request in one pass over the body, into buffers it keeps
// between requests (argsReaderPool): the Pod is decoded by encoding/json
// from its bytes, NodeNames are read as strings sharing one allocation,
// without reflection. A body it does not read itself (a Nodes list, names
// or keys with escapes or beyond ASCII, anything malformed) it hands to the
// standard decoder (decodeJSON) over the same bytes, so every body gets
// the arguments, status and message jsonEndpoint gives it. One handler
// goroutine owns it from argsReaderPool.Get to release.
type argsReader struct {
	body bytes.Buffer
	args extenderv1.ExtenderArgs
	// names backs args.NodeNames when the reader read them; their bytes
	// are chars, name i ending at ends[i].
	names []string
	chars []byte
	ends  []int
	key   []byte
}

// argsReaderPool holds argsReaders between requests.
var argsReaderPool = sync.Pool{New: func() any { return new(argsReader) }}

// maxPooledBytes is the largest buffer the codec keeps for the next
// request: a rare huge body (a Nodes list) is not held for ever.
const maxPooledBytes = 1 << 20

// maxFastDepth is the deepest nesting of a value the reader judges; a
// deeper one goes to the standard decoder, whose own limit counts from the
// top of the body.
const maxFastDepth = 1000

// Keys of ExtenderArgs, matched as encoding/json matches field names:
// exactly or by bytes.EqualFold (of ASCII keys: the reader reads no
// other).
var (
	keyPod       = []byte("Pod")
	keyNodes     = []byte("Nodes")
	keyNodeNames = []byte("NodeNames")
)

// release forgets the request and puts ar back in the pool; neither ar nor
// its args may be used afterwards.
func (ar *argsReader) release() {
	clear(ar.names)
	ar.args = extenderv1.ExtenderArgs{}
	ar.names, ar.chars, ar.ends = ar.names[:0], ar.chars[:0], ar.ends[:0]
	if ar.body.Cap() > maxPooledBytes {
		ar.body = bytes.Buffer{}
	}
	ar.body.Reset()
	if cap(ar.chars) > maxPooledBytes {
		ar.names, ar.chars, ar.ends = nil, nil, nil
	}
	argsReaderPool.Put(ar)
}

// read reads r's body into ar.args, as decode would: the status and
// error of a body decode refuses are decode's.
func (ar *argsReader) read(w http.ResponseWriter, r *http.Request) (int, error) {
	if status, err := checkContentType(r); err != nil {
		return status, err
	}
	if n := r.ContentLength; n > 0 && n <= MaxRequestBytes {
		ar.body.Grow(int(n) + bytes.MinRead)
	}
	_, readErr := ar.body.ReadFrom(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	return ar.decode(ar.body.Bytes(), readErr)
}

// decode sets ar.args from body, the bytes read before readErr (nil: the
// whole body): by parse when it reads body, else by decodeJSON over the
// same bytes followed by readErr.
func (ar *argsReader) decode(body []byte, readErr error) (int, error) {
	if readErr == nil && ar.parse(body) {
		return 0, nil
	}
	ar.args = extenderv1.ExtenderArgs{}
	var in io.Reader = bytes.NewReader(body)
	if readErr != nil {
		in = io.MultiReader(in, failingReader{readErr})
	}
	return decodeJSON(in, &ar.args)
}

// failingReader is a body that failed to read: every Read returns err.
type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) { return 0, f.err }

// parse sets ar.args from body and reports true when body is one JSON
// object whose Pod is an object or null (given once), whose NodeNames are
// strings or null, whose Nodes is null, whose other members are valid
// JSON, and whose Pod encoding/json decodes: then the arguments are those
// json.Unmarshal gives. Anything else, valid or not, reports false, and
// ar.args is then undefined.
func (ar *argsReader) parse(body []byte) bool {
	p := parser{b: body}
	if !p.next('{') {
		return false
	}
	var pod []byte
	podSeen := false
	if p.next('}') {
		return ar.finish(&p, nil)
	}
	for {
		p.space()
		var ok bool
		if ar.key, ok = p.str(ar.key[:0]); !ok || !p.next(':') {
			return false
		}
		p.space()
		switch {
		case bytes.EqualFold(ar.key, keyPod):
			// A second Pod would be decoded into the first.
			if podSeen {
				return false
			}
			podSeen = true
			if !p.null() {
				if pod, ok = p.object(); !ok {
					return false
				}
			}
		case bytes.EqualFold(ar.key, keyNodeNames):
			// The last NodeNames wins, as encoding/json resets a slice.
			ar.args.NodeNames = nil
			if !p.null() {
				if !ar.readNames(&p) {
					return false
				}
				ar.args.NodeNames = &ar.names
			}
		case bytes.EqualFold(ar.key, keyNodes):
			if !p.null() {
				return false
			}
		default:
			if !p.skipValue() {
				return false
			}
		}
		if !p.next(',') {
			return p.next('}') && ar.finish(&p, pod)
		}
	}
}

// finish checks that nothing but whitespace follows the object at p and
// decodes pod, the Pod's object (nil: none), into ar.args.
func (ar *argsReader) finish(p *parser, pod []byte) bool {
	p.space()
	if p.i != len(p.b) {
		return false
	}
	if pod != nil {
		ar.args.Pod = new(corev1.Pod)
		if json.Unmarshal(pod, ar.args.Pod) != nil {
			return false
		}
	}
	return true
}

// readNames reads an array of strings at p into ar.names, which share one
// string's bytes. It reports false for anything but such an array.
func (ar *argsReader) readNames(p *parser) bool {
	if !p.next('[') {
		return false
	}
	ar.chars, ar.ends = ar.chars[:0], ar.ends[:0]
	for more := !p.next(']'); more; {
		p.space()
		var ok bool
		if ar.chars, ok = p.str(ar.chars); !ok {
			return false
		}
		ar.ends = append(ar.ends, len(ar.chars))
		if !p.next(',') {
			if !p.next(']') {
				return false
			}
			more = false
		}
	}
	all := string(ar.chars)
	if ar.names == nil {
		ar.names = make([]string, 0, len(ar.ends))
	}
	ar.names = ar.names[:0]
	start := 0
	for _, end := range ar.ends {
		ar.names = append(ar.names, all[start:end])
		start = end
	}
	return true
}

// parser is a position in a JSON text.
type parser struct {
	b []byte
	i int
}

// space skips JSON whitespace.
func (p *parser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// next skips whitespace and then c, reporting whether c was there; it
// skips only the whitespace when not.
func (p *parser) next(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// null skips the literal null at p, reporting whether it was there.
func (p *parser) null() bool {
	if bytes.HasPrefix(p.b[p.i:], []byte("null")) {
		p.i += len("null")
		return true
	}
	return false
}

// str reads the JSON string at p and appends its value to dst, when it
// is printable ASCII without escapes, as every node name and key
// kube-scheduler sends is; for any other it reports false, and the body
// goes to encoding/json, which unquotes escapes and invalid UTF-8 its own
// way.
func (p *parser) str(dst []byte) ([]byte, bool) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return dst, false
	}
	for i := p.i + 1; i < len(p.b); i++ {
		switch c := p.b[i]; {
		case c == '"':
			dst = append(dst, p.b[p.i+1:i]...)
			p.i = i + 1
			return dst, true
		case c < ' ' || c == '\\' || c >= utf8.RuneSelf:
			return dst, false
		}
	}
	return dst, false
}

// object returns the JSON object at p, found by its brackets and strings
// only: the caller has it decoded, which checks it.
func (p *parser) object() ([]byte, bool) {
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return nil, false
	}
	end, ok := valueEnd(p.b, p.i)
	if !ok {
		return nil, false
	}
	v := p.b[p.i:end]
	p.i = end
	return v, true
}

// skipValue skips the JSON value at p, reporting whether it was one.
func (p *parser) skipValue() bool {
	end, ok := valueEnd(p.b, p.i)
	if !ok || !json.Valid(p.b[p.i:end]) {
		return false
	}
	p.i = end
	return true
}

// valueEnd returns where the JSON value starting at b[i] ends, as found by
// its brackets and strings, or by the run of the characters of numbers
// and literals; false when nothing starts a value there, the value is not
// closed or it nests deeper than maxFastDepth. The value is not checked.
func valueEnd(b []byte, i int) (int, bool) {
	depth := 0
	for j := i; j < len(b); j++ {
		switch c := b[j]; c {
		case '"':
			end, ok := stringEnd(b, j)
			if !ok {
				return 0, false
			}
			if depth == 0 {
				return end, true
			}
			j = end - 1
		case '{', '[':
			if depth++; depth > maxFastDepth {
				return 0, false
			}
		case '}', ']':
			if depth--; depth <= 0 {
				return j + 1, depth == 0
			}
		default:
			if depth == 0 {
				end := j
				for end < len(b) && isLiteralByte(b[end]) {
					end++
				}
				return end, end > j
			}
		}
	}
	return 0, false
}

// isLiteralByte reports whether c may be in a JSON number or literal.
func isLiteralByte(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || c == '-' || c == '+' || c == '.' || c == 'E'
}

// stringEnd returns the end of the JSON string that starts with the quote
// at b[i]: past the first quote not escaped by a backslash.
func stringEnd(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}
