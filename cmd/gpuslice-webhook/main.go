// Command gpuslice-webhook is gpuslice's mutating admission webhook: it
// serves AdmissionReview v1 over TLS for pod creation, steering GPU pods to
// the gpuslice scheduler profile, filling defaults and rejecting invalid
// requests. It only wires flags, configuration and signals; the behaviour
// lives in package webhook.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/internal/configfile"
	"github.com/gpuslice/gpuslice/internal/kubeclient"
	"github.com/gpuslice/gpuslice/webhook"
)

// version is stamped at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

// run returns the process exit code: 0 after a clean stop (SIGTERM or
// SIGINT), 1 when serving fails, 2 for bad flags, configuration or
// certificate files. Errors are printed on one line.
func run(args []string) int {
	const name = "gpuslice-webhook"
	fail := func(code int, err error) int {
		fmt.Fprintf(os.Stderr, "%s: %s\n", name, strings.ReplaceAll(err.Error(), "\n", "; "))
		return code
	}
	cfg, kubeconfig, err := parseFlags(name, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return fail(2, err)
	}
	var templates webhook.Templates
	if cfg.DRA.Enabled {
		rc, err := kubeclient.Config(kubeconfig, name+"/"+version)
		if err != nil {
			return fail(2, err)
		}
		client, err := resourcev1client.NewForConfig(rc)
		if err != nil {
			return fail(2, err)
		}
		templates = webhook.ClientTemplates{Client: client}
	}
	server, err := webhook.NewServerWithTemplates(cfg, templates)
	if err != nil {
		return fail(2, err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background().WithName(name)
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Starting", "version", version)
	if err := server.Run(ctx); err != nil {
		return fail(1, err)
	}
	logger.Info("Stopped")
	return 0
}

// parseFlags builds the ServerConfig: defaults, then the --config file,
// then the flags given on the command line. Flags are bound to the config
// itself; when a file is read, the flags that were set are applied again on
// top of it.
func parseFlags(name string, args []string) (webhook.ServerConfig, string, error) {
	cfg := webhook.DefaultServerConfig()
	var kubeconfig string
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	klog.InitFlags(fs)
	configFile := fs.String("config", "", "YAML or JSON file with the webhook configuration; flags given on the command line override it")
	fs.StringVar(&cfg.Address, "address", cfg.Address, "host:port to serve HTTPS on")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", cfg.TLSCertFile, "PEM serving certificate (e.g. tls.crt of a Secret volume); reloaded when it changes")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key-file", cfg.TLSKeyFile, "PEM private key of --tls-cert-file; reloaded when it changes")
	fs.StringVar(&cfg.SchedulerName, "scheduler-name", cfg.SchedulerName, "scheduler profile GPU pods are steered to (the one that calls the gpuslice extender)")
	fs.Var((*configfile.List)(&cfg.ExcludedNamespaces), "excluded-namespaces", "comma-separated namespaces whose pods are left alone (empty: none)")
	fs.BoolVar(&cfg.HAMiCompat, "hami-compat", cfg.HAMiCompat, "rewrite HAMi's resource names (nvidia.com/gpu, …) and pod annotations to gpuslice's (docs/migrating-from-hami.md)")
	fs.BoolVar(&cfg.DRA.Enabled, "dra", cfg.DRA.Enabled, "turn GPU pods bound for DRA-mode nodes into resource claims (docs/dra.md); needs an API client")
	fs.Var((*configfile.List)(&cfg.DRA.Namespaces), "dra-namespaces", `comma-separated namespaces whose GPU pods all become claims ("*": every namespace); other pods only when they select gpuslice.hami.io/mode=dra`)
	fs.BoolVar(&cfg.DRA.Score, "dra-score", cfg.DRA.Score, "steer the pods turned into claims to --scheduler-name too, whose extender scores DRA pods' nodes (the extender's --dra)")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig for creating the claim templates of converted pods (default: in-cluster; used only with dra)")
	if err := configfile.Parse(fs, args, &cfg, webhook.DefaultServerConfig(), configFile); err != nil {
		return cfg, kubeconfig, err
	}
	return cfg, kubeconfig, cfg.Validate()
}
