package deploy_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
	appsv1 "k8s.io/api/apps/v1"
)

// containerdNRI is containerd's NRI plugin table, the same in 1.7 and 2.x.
// Decoding refuses any other key, so a misspelt or misplaced one fails.
type containerdNRI struct {
	Disable                   *bool   `toml:"disable"`
	DisableConnections        *bool   `toml:"disable_connections"`
	SocketPath                string  `toml:"socket_path"`
	PluginPath                string  `toml:"plugin_path"`
	PluginConfigPath          string  `toml:"plugin_config_path"`
	PluginRegistrationTimeout string  `toml:"plugin_registration_timeout"`
	PluginRequestTimeout      string  `toml:"plugin_request_timeout"`
	DefaultValidator          *string `toml:"default_validator"` // never set here; a table in 2.2+
}

// containerdConfig is a containerd configuration snippet: its version and
// NRI table, nothing else.
type containerdConfig struct {
	Version int `toml:"version"`
	Plugins struct {
		NRI *containerdNRI `toml:"io.containerd.nri.v1.nri"`
	} `toml:"plugins"`
}

// crioConfig is a CRI-O drop-in with the [crio.nri] table only.
type crioConfig struct {
	Crio struct {
		NRI *struct {
			EnableNRI                 *bool  `toml:"enable_nri"`
			Listen                    string `toml:"nri_listen"`
			PluginDir                 string `toml:"nri_plugin_dir"`
			PluginConfigDir           string `toml:"nri_plugin_config_dir"`
			DisableConnections        *bool  `toml:"nri_disable_connections"`
			PluginRegistrationTimeout string `toml:"nri_plugin_registration_timeout"`
			PluginRequestTimeout      string `toml:"nri_plugin_request_timeout"`
		} `toml:"nri"`
	} `toml:"crio"`
}

// decodeTOML decodes TOML strictly: unknown keys are errors, reported with
// their place in the file.
func decodeTOML(data []byte, v any) error {
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		return errors.New(strict.String())
	}
	return err
}

// decodeTOMLFile decodes a snippet under deploy/runtime strictly.
func decodeTOMLFile(t *testing.T, name string, v any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("runtime", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeTOML(data, v); err != nil {
		t.Fatalf("runtime/%s: %v", name, err)
	}
}

// nriSocketOfBase is the NRI socket the base DaemonSet connects to.
func nriSocketOfBase(t *testing.T) string {
	t.Helper()
	ds := find[appsv1.DaemonSet](t, renderDir(t, "base"), "DaemonSet", proxyName)
	return argValues(t, proxyContainer(t, ds).Args)["nri-socket"]
}

// checkTimeout checks a timeout value parses and is at least min.
func checkTimeout(t *testing.T, key, value string, min time.Duration) {
	t.Helper()
	d, err := time.ParseDuration(value)
	if err != nil {
		t.Errorf("%s = %q: %v", key, value, err)
		return
	}
	if d < min {
		t.Errorf("%s = %s, want at least %s", key, d, min)
	}
}

func TestContainerdSnippetsEnableNRIWhereThePodConnects(t *testing.T) {
	socket := nriSocketOfBase(t)
	for file, version := range map[string]int{"containerd-1.7.toml": 2, "containerd-2.x.toml": 3} {
		t.Run(file, func(t *testing.T) {
			var c containerdConfig
			decodeTOMLFile(t, file, &c)
			if c.Version != version {
				t.Errorf("version = %d, want %d", c.Version, version)
			}
			n := c.Plugins.NRI
			if n == nil {
				t.Fatal(`no [plugins."io.containerd.nri.v1.nri"] table`)
			}
			if n.Disable == nil || *n.Disable {
				t.Error("disable is not false: containerd 1.7 keeps NRI off unless told")
			}
			if n.DisableConnections != nil && *n.DisableConnections {
				t.Error("disable_connections is true: podres-proxy is an external plugin and must connect")
			}
			if n.SocketPath != socket {
				t.Errorf("socket_path = %q, the DaemonSet connects to %q", n.SocketPath, socket)
			}
			checkTimeout(t, "plugin_registration_timeout", n.PluginRegistrationTimeout, time.Second)
			checkTimeout(t, "plugin_request_timeout", n.PluginRequestTimeout, time.Second)
		})
	}
}

func TestStrictTOMLRefusesATimeoutAtTheRoot(t *testing.T) {
	// A key at the root is silently ignored by containerd (nri-plugins#745);
	// the strict decode above refuses unknown keys anywhere, and this test
	// shows it does so for a timeout written at the root.
	bad := "version = 3\nplugin_request_timeout = \"2s\"\n\n[plugins.'io.containerd.nri.v1.nri']\ndisable = false\n"
	var c containerdConfig
	err := decodeTOML([]byte(bad), &c)
	if err == nil || !strings.Contains(err.Error(), "plugin_request_timeout") {
		t.Errorf("decoding a root-level timeout: err = %v, want one naming plugin_request_timeout", err)
	}
}

func TestCRIOSnippetEnablesNRIWhereThePodConnects(t *testing.T) {
	var c crioConfig
	decodeTOMLFile(t, "crio-nri.conf", &c)
	n := c.Crio.NRI
	if n == nil {
		t.Fatal("no [crio.nri] table")
	}
	if n.EnableNRI == nil || !*n.EnableNRI {
		t.Error("enable_nri is not true")
	}
	if n.DisableConnections != nil && *n.DisableConnections {
		t.Error("nri_disable_connections is true: podres-proxy must connect")
	}
	if socket := nriSocketOfBase(t); n.Listen != socket {
		t.Errorf("nri_listen = %q, the DaemonSet connects to %q", n.Listen, socket)
	}
	checkTimeout(t, "nri_plugin_registration_timeout", n.PluginRegistrationTimeout, time.Second)
	checkTimeout(t, "nri_plugin_request_timeout", n.PluginRequestTimeout, time.Second)
}
