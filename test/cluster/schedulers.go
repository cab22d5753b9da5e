package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Lease kube-scheduler's leader election holds when several scheduler pairs run
// (Options.Schedulers), as the chart's: in the lock namespace, named after the scheduler.
const (
	LeaderLeaseNamespace = metav1.NamespaceSystem
	LeaderLeaseName      = SchedulerName
)

// LeaderElection is kube-scheduler's leader-election timing (its leaderElection leaseDuration,
// renewDeadline and retryPeriod). A zero field takes kube-scheduler's default: 15 s, 10 s, 2 s.
type LeaderElection struct {
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// withDefaults fills the zero fields with kube-scheduler's defaults.
func (l LeaderElection) withDefaults() LeaderElection {
	if l.LeaseDuration == 0 {
		l.LeaseDuration = 15 * time.Second
	}
	if l.RenewDeadline == 0 {
		l.RenewDeadline = 10 * time.Second
	}
	if l.RetryPeriod == 0 {
		l.RetryPeriod = 2 * time.Second
	}
	return l
}

// SchedulerPair is one kube-scheduler and the extender beside it, as one pod of the chart's
// scheduler Deployment: with several pairs (Options.Schedulers) both processes of a pair run in UTS
// namespaces of their own under the pair's Hostname, as a pod's containers share the pod's
// hostname, so that kube-scheduler's leader identity (hostname, "_", a UUID) tells the pairs apart
// and the extender knows its own kube-scheduler by it; each process authenticates as its own user,
// so that the audit log (Options.Audit) tells who wrote what.
type SchedulerPair struct {
	// Hostname is the pair's host name; empty for the single pair, which runs in this host's.
	Hostname string `json:"hostname,omitempty"`
	// KubeScheduler and Extender are the names of the pair's processes (Process, Restart).
	KubeScheduler string `json:"kubeScheduler"`
	Extender      string `json:"extender"`
	// KubeSchedulerUser and ExtenderUser are the API users the two authenticate as; the admin
	// user for the single pair.
	KubeSchedulerUser string `json:"kubeSchedulerUser"`
	ExtenderUser      string `json:"extenderUser"`
	// ExtenderPort is the extender's plain-HTTP loopback port.
	ExtenderPort int `json:"extenderPort"`
}

// ExtenderURL returns the pair's extender's base URL.
func (p SchedulerPair) ExtenderURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(p.ExtenderPort)
}

// schedulerPair returns pair i of n: pair 0 keeps the names of the single pair (KubeSchedulerName,
// ExtenderName), the others add "-<i>".
func schedulerPair(i, n int) SchedulerPair {
	p := SchedulerPair{KubeScheduler: KubeSchedulerName, Extender: ExtenderName, KubeSchedulerUser: adminUser, ExtenderUser: adminUser}
	if i > 0 {
		p.KubeScheduler += "-" + strconv.Itoa(i)
		p.Extender += "-" + strconv.Itoa(i)
	}
	if n > 1 {
		p.Hostname = "scheduler-" + strconv.Itoa(i)
		p.KubeSchedulerUser, p.ExtenderUser = "kube-scheduler-"+strconv.Itoa(i), "gpuslice-scheduler-"+strconv.Itoa(i)
	}
	return p
}

// schedulerUsers returns the API users of n scheduler pairs besides the admin.
func schedulerUsers(n int) []string {
	var users []string
	for i := range n {
		if p := schedulerPair(i, n); p.Hostname != "" {
			users = append(users, p.KubeSchedulerUser, p.ExtenderUser)
		}
	}
	return users
}

// startSchedulers starts every scheduler pair of opts, one after another: the extender (waiting for
// its /readyz), then kube-scheduler (waiting for its /healthz). With several pairs, kube-scheduler
// runs leader election and the extender follows its Lease, and the first pair is waited for until
// it leads, so that pair 0 is the leader when Start returns. With opts.APIProxy the extenders reach
// the API server through the cluster's APIProxy.
func (c *Cluster) startSchedulers(ctx context.Context, opts Options, extenderArgs []string) error {
	n := max(opts.Schedulers, 1)
	if n > 1 && opts.SchedulerConfig != "" {
		return errors.New("options: Schedulers above 1 needs the built-in scheduler configuration, not SchedulerConfig")
	}
	le := opts.LeaderElection.withDefaults()
	for i := range n {
		pair := schedulerPair(i, n)
		extKubeconfig, ksKubeconfig := c.State.Kubeconfig, c.State.Kubeconfig
		if pair.Hostname != "" || c.proxy != nil {
			server, ca := c.RESTConfig().Host, c.State.CAData
			if c.proxy != nil {
				server, ca = c.proxy.URL(), c.proxy.CAData()
			}
			extKubeconfig = filepath.Join(c.State.Dir, pair.Extender, "kubeconfig")
			if err := c.writeKubeconfigFor(extKubeconfig, server, ca, c.State.tokenOf(pair.ExtenderUser)); err != nil {
				return err
			}
			ksKubeconfig = filepath.Join(c.State.Dir, pair.KubeScheduler, "kubeconfig")
			if err := c.writeKubeconfigFor(ksKubeconfig, c.RESTConfig().Host, c.State.CAData, c.State.tokenOf(pair.KubeSchedulerUser)); err != nil {
				return err
			}
		}
		args := extenderArgs
		if pair.Hostname != "" {
			args = append([]string{extenderLeaderFlag}, extenderArgs...)
		}
		port, err := c.startExtender(ctx, pair, extKubeconfig, args)
		if err != nil {
			return err
		}
		pair.ExtenderPort = port
		c.mu.Lock()
		c.State.Schedulers = append(c.State.Schedulers, pair)
		if i == 0 {
			c.State.ExtenderPort = port
		}
		err = c.saveStateLocked()
		c.mu.Unlock()
		if err != nil {
			return err
		}
		var leader *LeaderElection
		if pair.Hostname != "" {
			leader = &le
		}
		if err := c.startScheduler(ctx, pair, ksKubeconfig, opts.SchedulerConfig, opts.DRAScore, leader); err != nil {
			return err
		}
		if i == 0 && n > 1 {
			if err := c.waitFor(ctx, "kube-scheduler "+pair.Hostname+" leading", []*Process{c.process(pair.KubeScheduler)}, func(ctx context.Context) (bool, error) {
				leading, err := c.SchedulerLeader(ctx)
				return err == nil && leading == 0, nil
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// extenderLeaderFlag has an extender of several pairs follow kube-scheduler's Lease, as the
// chart's do.
const extenderLeaderFlag = "--leader-lease=" + LeaderLeaseNamespace + "/" + LeaderLeaseName

// inHost returns the program and arguments that run bin with args under hostname, in a UTS
// namespace of its own (the process keeps its PID: unshare and the shell exec it); an empty
// hostname runs it as it is.
func inHost(hostname, bin string, args []string) (string, []string, error) {
	if hostname == "" {
		return bin, args, nil
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return "", nil, fmt.Errorf("needs unshare(1) to give %s its own host name: %w", bin, err)
	}
	return unshare, append([]string{"--uts", "--", "/bin/sh", "-c", `hostname "$0" && exec "$@"`, hostname, bin}, args...), nil
}

// Schedulers returns the scheduler pairs, pair 0 first (empty on a cluster installed from the
// chart).
func (c *Cluster) Schedulers() []SchedulerPair {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]SchedulerPair(nil), c.State.Schedulers...)
}

// SchedulerLeader returns the index in Schedulers of the pair whose kube-scheduler holds the leader
// Lease (LeaderLeaseNamespace/LeaderLeaseName) by its holder identity, or -1 when none does: no
// Lease, no holder, a holder of no pair, or a lease that has expired by its renewTime.
func (c *Cluster) SchedulerLeader(ctx context.Context) (int, error) {
	l, err := c.client.CoordinationV1().Leases(LeaderLeaseNamespace).Get(ctx, LeaderLeaseName, metav1.GetOptions{})
	if err != nil {
		return -1, fmt.Errorf("read the scheduler's leader Lease: %w", err)
	}
	if l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return -1, nil
	}
	if time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
		return -1, nil
	}
	for i, p := range c.Schedulers() {
		if p.Hostname != "" && strings.HasPrefix(*l.Spec.HolderIdentity, p.Hostname+"_") {
			return i, nil
		}
	}
	return -1, nil
}

// pairOf returns the scheduler pair one of whose processes is named name, and whether that is
// its extender.
func (c *Cluster) pairOf(name string) (SchedulerPair, bool, bool) {
	for _, p := range c.Schedulers() {
		if p.KubeScheduler == name || p.Extender == name {
			return p, p.Extender == name, true
		}
	}
	return SchedulerPair{}, false, false
}

// tokenOf returns user's bearer token: the admin's, or one of Tokens.
func (st *State) tokenOf(user string) string {
	if t, ok := st.Tokens[user]; ok {
		return t
	}
	return st.Token
}

// writeTokens writes the token file of the admin (State.Token) and of users (a new token each,
// kept in State.Tokens), all in group system:masters: this cluster tests gpuslice, not RBAC.
func (c *Cluster) writeTokens(path string, users []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s,%s,%s,system:masters\n", c.State.Token, adminUser, adminUser)
	for _, u := range users {
		t, err := newToken()
		if err != nil {
			return err
		}
		if c.State.Tokens == nil {
			c.State.Tokens = map[string]string{}
		}
		c.State.Tokens[u] = t
		fmt.Fprintf(&b, "%s,%s,%s,system:masters\n", t, u, u)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	return nil
}
