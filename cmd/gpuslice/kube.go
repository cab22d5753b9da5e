package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
	"golang.org/x/term"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuslice/gpuslice/internal/inspect"
	"github.com/gpuslice/gpuslice/vgpu"
)

// kubeFlags are the API-server flags of status, doctor and why, read as
// kubectl reads them: --kubeconfig, else $KUBECONFIG, else
// ~/.kube/config; --context; -n/--namespace, else the context's.
type kubeFlags struct {
	kubeconfig, context, namespace string
	heartbeatNamespace             string
}

func (k *kubeFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&k.context, "context", "", "kubeconfig context (default the current one)")
	fs.StringVarP(&k.namespace, "namespace", "n", "", "namespace (default the context's)")
	fs.StringVar(&k.heartbeatNamespace, "heartbeat-namespace", vgpu.DefaultHeartbeatNamespace, "namespace of the device plugins' heartbeat Leases (as the device plugin's heartbeatNamespace setting)")
}

// connect is how a subcommand gets its client and namespace; tests pass
// a fake clientset instead of a kubeconfig.
type connect func(k kubeFlags) (client kubernetes.Interface, namespace string, err error)

// kubeconfigClient loads the kubeconfig as kubectl does.
func kubeconfigClient(k kubeFlags) (kubernetes.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: k.context}
	overrides.Context.Namespace = k.namespace
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "gpuslice/" + version
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig namespace: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("API client: %w", err)
	}
	return client, ns, nil
}

// command is what status, doctor and why share: a flag set that, like
// kubectl's, takes flags after positional arguments, the kubeconfig flags
// and -o.
type command struct {
	fs     *pflag.FlagSet
	kube   kubeFlags
	output string
}

// newCommand returns the flags of subcommand name; outputHelp describes -o.
func newCommand(name, outputHelp string, out io.Writer) *command {
	c := &command{fs: pflag.NewFlagSet(name, pflag.ContinueOnError)}
	c.fs.SetOutput(out)
	c.fs.SetInterspersed(true)
	c.kube.add(c.fs)
	c.fs.StringVarP(&c.output, "output", "o", "", outputHelp)
	return c
}

// parse reads args and returns the -o format, one of formats or the table.
func (c *command) parse(args []string, formats ...inspect.Format) (inspect.Format, error) {
	if err := c.fs.Parse(args); err != nil {
		return "", err
	}
	return inspect.ParseFormat(c.output, formats...)
}

// styleFor colours output only on a terminal, and never with $NO_COLOR.
func styleFor(out io.Writer) inspect.Style {
	f, ok := out.(*os.File)
	return inspect.Style{Colour: ok && term.IsTerminal(int(f.Fd())) && os.Getenv("NO_COLOR") == ""} //nolint:gosec // G115: a file descriptor
}
