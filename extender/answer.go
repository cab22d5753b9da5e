package extender

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// filterAnswer is Filter's answer for one pod as slices in the order of
// the candidates, from a pool: the HTTP codec writes it as JSON
// (appendFilterAnswer) and Filter turns it into an ExtenderFilterResult
// (result). One goroutine owns it from newFilterAnswer to release.
type filterAnswer struct {
	// names are the candidates the answer is about (candidates).
	names []string
	// passed are the indices in names of the nodes that passed.
	passed []int
	// failed and unresolvable are the nodes of FailedNodes and of
	// FailedAndUnresolvableNodes with their messages, in the order of
	// names; a name may come twice when kube-scheduler sent it twice.
	failed, unresolvable []failedNode
	// err, when set, is the Error of a pod that cannot be placed: then no
	// node passed or failed, and the answer has neither NodeNames nor
	// Nodes.
	err string
}

// failedNode is one node turned away, by its index in the candidates, and
// the message for the pod's FailedScheduling event.
type failedNode struct {
	node    int
	message string
}

// filterAnswerPool holds filterAnswers between calls: at thousands of
// nodes their slices are most of what Filter's answer costs.
var filterAnswerPool = sync.Pool{New: func() any { return new(filterAnswer) }}

// newFilterAnswer returns an empty answer about names from the pool.
func newFilterAnswer(names []string) *filterAnswer {
	a := filterAnswerPool.Get().(*filterAnswer)
	a.names = names
	return a
}

// release empties a and puts it back in the pool; a must not be used
// afterwards.
func (a *filterAnswer) release() {
	clear(a.failed)
	clear(a.unresolvable)
	*a = filterAnswer{passed: a.passed[:0], failed: a.failed[:0], unresolvable: a.unresolvable[:0]}
	filterAnswerPool.Put(a)
}

// result is a as the ExtenderFilterResult kube-scheduler reads, in the
// form of args: NodeNames when args has NodeNames, else Nodes with the
// passing items of args.Nodes. A name given twice is in FailedNodes (or
// FailedAndUnresolvableNodes) once, with the message of the later.
func (a *filterAnswer) result(args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	if a.err != "" {
		return &extenderv1.ExtenderFilterResult{
			FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}, Error: a.err,
		}
	}
	result := &extenderv1.ExtenderFilterResult{
		FailedNodes:                make(extenderv1.FailedNodesMap, len(a.failed)),
		FailedAndUnresolvableNodes: make(extenderv1.FailedNodesMap, len(a.unresolvable)),
	}
	for _, f := range a.failed {
		result.FailedNodes[a.names[f.node]] = f.message
	}
	for _, f := range a.unresolvable {
		result.FailedAndUnresolvableNodes[a.names[f.node]] = f.message
	}
	if args.NodeNames != nil {
		passed := make([]string, len(a.passed))
		for j, i := range a.passed {
			passed[j] = a.names[i]
		}
		result.NodeNames = &passed
		return result
	}
	items := make([]corev1.Node, len(a.passed))
	for j, i := range a.passed {
		items[j] = args.Nodes.Items[i]
	}
	result.Nodes = &corev1.NodeList{Items: items}
	return result
}

// appendFilterAnswer appends the JSON of a.result(args), byte for byte as
// encoding/json writes it (FailedNodes sorted by name, a name given twice
// once, with its later message), without building the result: NodeNames
// and the failed nodes come straight from a's slices, whose failed nodes
// it sorts. An answer in the form of Nodes (args without NodeNames) is
// encoded by encoding/json, whole Nodes and all.
func appendFilterAnswer(dst []byte, args *extenderv1.ExtenderArgs, a *filterAnswer) ([]byte, error) {
	switch {
	case a.err != "":
		dst = append(dst, `{"Nodes":null,"NodeNames":null,"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":`...)
		return append(appendJSONString(dst, a.err), '}'), nil
	case args.NodeNames == nil:
		body, err := json.Marshal(a.result(args))
		return append(dst, body...), err
	}
	dst = append(dst, `{"Nodes":null,"NodeNames":[`...)
	for j, i := range a.passed {
		if j > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, a.names[i])
	}
	dst = append(dst, `],"FailedNodes":`...)
	dst = appendFailedNodes(dst, a.names, a.failed)
	dst = append(dst, `,"FailedAndUnresolvableNodes":`...)
	dst = appendFailedNodes(dst, a.names, a.unresolvable)
	return append(dst, `,"Error":""}`...), nil
}

// appendFailedNodes appends nodes as the JSON object of a FailedNodesMap
// encoding/json writes: keys in byte order, each once, with the message of
// the last of its nodes. It sorts nodes.
func appendFailedNodes(dst []byte, names []string, nodes []failedNode) []byte {
	slices.SortFunc(nodes, func(x, y failedNode) int {
		if c := strings.Compare(names[x.node], names[y.node]); c != 0 {
			return c
		}
		return cmp.Compare(x.node, y.node)
	})
	// Most nodes share one of a few messages (one per reason and
	// container): the last few escaped are copied rather than escaped
	// again.
	var recent [4]escapedMessage
	next := 0
	dst = append(dst, '{')
	first := true
	for k, f := range nodes {
		name := names[f.node]
		if k+1 < len(nodes) && names[nodes[k+1].node] == name {
			continue // a later message for the same name wins, as in a map
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(appendJSONString(dst, name), ':')
		found := false
		for _, m := range recent {
			if m.end > 0 && m.message == f.message {
				dst = append(dst, dst[m.start:m.end]...)
				found = true
				break
			}
		}
		if !found {
			start := len(dst)
			dst = appendJSONString(dst, f.message)
			recent[next%len(recent)] = escapedMessage{f.message, start, len(dst)}
			next++
		}
	}
	return append(dst, '}')
}

// escapedMessage is a message appendFailedNodes wrote, at dst[start:end].
type escapedMessage struct {
	message    string
	start, end int
}

// appendHostPriorities appends list as encoding/json writes it.
func appendHostPriorities(dst []byte, _ *extenderv1.ExtenderArgs, list extenderv1.HostPriorityList) ([]byte, error) {
	if list == nil {
		return append(dst, "null"...), nil
	}
	dst = append(dst, '[')
	for i := range list {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"Host":`...)
		dst = appendJSONString(dst, list[i].Host)
		dst = append(dst, `,"Score":`...)
		dst = append(strconv.AppendInt(dst, list[i].Score, 10), '}')
	}
	return append(dst, ']'), nil
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it: quote and backslash, \b \f \n \r \t, other control bytes and
// < > & as \u00XX, each invalid UTF-8 byte as \ufffd, and U+2028 and
// U+2029 as \u2028 and \u2029; every other byte as it is.
func appendJSONString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	done := 0 // s[:done] is in dst
	for i := 0; i < len(s); {
		c := s[i]
		if jsonPlain[c] {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			var esc string
			switch {
			case r == utf8.RuneError && size == 1:
				esc = `\ufffd`
			case r == '\u2028':
				esc = `\u2028`
			case r == '\u2029':
				esc = `\u2029`
			default:
				i += size
				continue
			}
			dst = append(append(dst, s[done:i]...), esc...)
			i += size
			done = i
			continue
		}
		dst = append(dst, s[done:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		done = i
	}
	return append(append(dst, s[done:]...), '"')
}

// jsonPlain tells the bytes appendJSONString copies as they are: printable
// ASCII but quote, backslash, <, > and &. It is never written after init.
var jsonPlain = func() (plain [256]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		plain[c] = !strings.ContainsRune(`"\<>&`, c)
	}
	return plain
}()

// answerBuffer is the buffer one answer is written into, from
// answerPool.
type answerBuffer struct{ b []byte }

// answerPool holds answerBuffers between requests.
var answerPool = sync.Pool{New: func() any { return new(answerBuffer) }}

// release puts buf back in the pool, unless it grew above
// maxPooledBytes.
func (buf *answerBuffer) release() {
	if cap(buf.b) > maxPooledBytes {
		buf.b = nil
	}
	buf.b = buf.b[:0]
	answerPool.Put(buf)
}
