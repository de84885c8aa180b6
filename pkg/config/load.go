package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// ServiceAccountNamespaceFile is where Kubernetes mounts the pod's
// namespace.
const ServiceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// LoadOptions say where Load finds the layers above the defaults.
type LoadOptions struct {
	// Flags is a parsed flag set defined by AddFlags: --config names the
	// file, and every flag the user set overrides the file and the
	// environment. Nil: the file named by LIMITER_CONFIG and the
	// environment only.
	Flags *pflag.FlagSet
	// NamespaceFile is read for the pod's namespace when tiers.source is
	// kubernetes, tiers.namespace is unset and POD_NAMESPACE is empty.
	// Default ServiceAccountNamespaceFile.
	NamespaceFile string
	// Command is the command the configuration is for: CommandServe
	// (default; see ValidateServe) or CommandProxy, which also requires
	// proxy.upstream (see ValidateProxy).
	Command string
}

// Load builds the configuration from, in increasing precedence, the
// defaults of opts.Command (DefaultFor), the YAML file
// (--config or LIMITER_CONFIG; none by default), the environment
// (LIMITER_<KEY>; an empty variable counts as unset) and the flags the user
// set, then validates it. Lists in the environment are comma-separated
// (LIMITER_REDIS_ADDRS=a:6379,b:6379), except LIMITER_TIERS_STATIC and
// LIMITER_POOLS_STATIC, which hold a JSON or YAML list.
//
// A key in the file that Config does not have is an error, naming its
// line, and so is a LIMITER_ variable that is no setting, but for those of
// the limiter's tools (LIMITER_TEST_*, LIMITER_TOKEN...: see env.go).
// Every error wraps ErrInvalid.
func Load(opts LoadOptions) (Config, error) {
	cfg := DefaultFor(opts.Command)
	v := viper.New()
	v.SetConfigType("yaml")

	var file *configFile
	if path := configPath(opts.Flags); path != "" {
		data, err := os.ReadFile(path)
		if err == nil {
			err = v.ReadConfig(bytes.NewReader(data))
		}
		if err == nil {
			file, err = parseConfigFile(path, data)
		}
		if err == nil && file.stringsAsWritten() {
			// viper reads the file again, its strings as written.
			var marked []byte
			if marked, err = yaml.Marshal(file.root); err == nil {
				err = v.ReadConfig(bytes.NewReader(marked))
			}
		}
		if err != nil {
			return cfg, fmt.Errorf("%w: reading the config file (flag --%s, env %s): %w", ErrInvalid, FlagConfig, EnvConfig, err)
		}
	}
	if err := errors.Join(checkEnv(os.Environ()), file.checkKeys()); err != nil {
		return cfg, fmt.Errorf("%w: %w", ErrInvalid, err)
	}

	all := configKeys()
	for _, k := range all {
		if err := v.BindEnv(k.name, EnvVar(k.name)); err != nil {
			return cfg, err
		}
	}
	if opts.Flags != nil {
		for _, f := range flagSpecs {
			if flag := opts.Flags.Lookup(f.name); flag != nil {
				if err := v.BindPFlag(f.key, flag); err != nil {
					return cfg, err
				}
			}
		}
	}

	var errs []error
	for _, k := range all {
		if isListKey(k.name) || !v.IsSet(k.name) {
			continue
		}
		// Decode into a fresh value: decoding into the default would keep
		// default list entries beyond the configured ones.
		val := reflect.New(k.typ)
		err := v.UnmarshalKey(k.name, val.Interface(), viper.DecodeHook(decodeHook()), func(c *mapstructure.DecoderConfig) {
			c.ErrorUnused = true
		})
		if err != nil {
			errs = append(errs, &KeyError{Key: k.name, Problem: "cannot be read: " + decodeMessage(err), Err: err})
			continue
		}
		k.field(&cfg).Set(val.Elem())
	}
	errs = append(errs, loadLists(&cfg, file)...)
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}

	cfg.normalize()
	if cfg.Tiers.Source == SourceKubernetes && cfg.Tiers.Namespace == "" {
		cfg.Tiers.Namespace = podNamespace(opts.NamespaceFile)
	}
	err := cfg.Validate()
	if cfg.Tiers.Source == SourceKubernetes && (os.Getenv(EnvVar("tiers.static")) != "" || file.lookup("tiers.static") != nil) {
		// Tiers come from LimitTiers alone, as pools from LimitPools: the
		// plans it lists would be unknown_plan to every acquire, unseen.
		err = errors.Join(err, &KeyError{Key: "tiers.static", Problem: "must be unset with tiers.source kubernetes: tiers come from the LimitTier objects of tiers.namespace (config/samples), and the plans it lists would be unknown_plan to every acquire"})
	}
	if opts.Command == CommandProxy {
		err = errors.Join(err, cfg.ValidateProxy())
	} else {
		err = errors.Join(err, cfg.ValidateServe())
	}
	return cfg, err
}

// configPath returns the path given by --config, else by LIMITER_CONFIG.
func configPath(fs *pflag.FlagSet) string {
	if fs != nil {
		if f := fs.Lookup(FlagConfig); f != nil && f.Changed {
			return f.Value.String()
		}
	}
	return os.Getenv(EnvConfig)
}

// decodeMessage strips mapstructure's preamble from a decoding error.
func decodeMessage(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "decoding failed due to the following error(s):")
	msg = strings.Join(strings.Fields(msg), " ")
	return strings.TrimPrefix(msg, "'' ") // UnmarshalKey decodes a value with no field name

}

// podNamespace returns POD_NAMESPACE, else the namespace file's content,
// else "".
func podNamespace(file string) string {
	if ns := strings.TrimSpace(os.Getenv("POD_NAMESPACE")); ns != "" {
		return ns
	}
	if file == "" {
		file = ServiceAccountNamespaceFile
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
