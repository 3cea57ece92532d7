// Command peer_c2sp checks gridledger checkpoints against other implementations of
// the C2SP specs (SPEC.md §8.1–8.2):
//
//   - the ledger's signed-note signature (type 0x01) with golang.org/x/mod/sumdb/note;
//   - each witness cosignature (tlog-cosignature v1, Ed25519, type 0x04) with
//     github.com/transparency-dev/formats/note.NewVerifierForCosignatureV1, and the
//     cosignature's key id and timestamp decoded from the line as the C2SP text says;
//   - the checkpoint body with transparency-dev/formats/log (Checkpoint.Unmarshal and
//     ParseCheckpoint), against the expected origin, size and root;
//   - negative checks: one flipped body byte, and one flipped timestamp byte, must
//     make verification fail.
//
// Usage: go run . FILE.json [FILE.json ...]
//
// Each FILE has the shape of proto/vectors/checkpoint.json: "note" (the note text),
// "signers" (name -> base64 raw Ed25519 public key; "gridledger-ledger" is the log,
// every other name a cosigner), "origin", "size", "root_b64" and "cosigned_at_s".
// It prints one OK/FAIL line per check and exits 1 if any check failed.
package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"

	tlog "github.com/transparency-dev/formats/log"
	tdnote "github.com/transparency-dev/formats/note"
	"golang.org/x/mod/sumdb/note"
)

const ledgerName = "gridledger-ledger"

type vector struct {
	Note        string            `json:"note"`
	Signers     map[string]string `json:"signers"`
	Origin      string            `json:"origin"`
	Size        uint64            `json:"size"`
	RootB64     string            `json:"root_b64"`
	CosignedAtS uint64            `json:"cosigned_at_s"`
}

var failures int

func report(file, check string, err error) {
	if err != nil {
		failures++
		fmt.Printf("FAIL %s: %s: %v\n", file, check, err)
		return
	}
	fmt.Printf("OK   %s: %s\n", file, check)
}

// keyID is SHA-256(name || LF || type || public key)[:4], as C2SP signed-note and
// tlog-cosignature define it; computed here, not taken from either library.
func keyID(name string, typ byte, pub []byte) uint32 {
	h := sha256.New()
	h.Write([]byte(name + "\n"))
	h.Write([]byte{typ})
	h.Write(pub)
	return binary.BigEndian.Uint32(h.Sum(nil))
}

// vkey is a note verifier key string: name+hash+base64(type || public key).
func vkey(name string, typ byte, pub []byte) string {
	return fmt.Sprintf("%s+%08x+%s", name, keyID(name, typ, pub),
		base64.StdEncoding.EncodeToString(append([]byte{typ}, pub...)))
}

// signedBy is nil when the note opens with verifier v and carries a verified line of it.
func signedBy(msg []byte, v note.Verifier) error {
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		return err
	}
	for _, s := range n.Sigs {
		if s.Name == v.Name() && s.Hash == v.KeyHash() {
			return nil
		}
	}
	return errors.New("no verified line of " + v.Name())
}

// mustFail turns an expected verification failure into nil and a success into an error.
func mustFail(err error) error {
	if err == nil {
		return errors.New("tampered note still verified")
	}
	return nil
}

// flipBodyByte flips the low bit of the first byte of the tree size line (a decimal
// digit stays a digit), so the tampered body is still a well-formed checkpoint of the
// same origin and only the signatures can catch it.
func flipBodyByte(msg []byte) []byte {
	out := bytes.Clone(msg)
	out[bytes.IndexByte(out, '\n')+1] ^= 0x01
	return out
}

// flipTimestamp flips the last timestamp byte of name's line (keyid[4] || ts[8] || sig).
func flipTimestamp(msg []byte, name string) ([]byte, error) {
	prefix := []byte("\n— " + name + " ")
	i := bytes.Index(msg, prefix)
	if i < 0 {
		return nil, errors.New("no line of " + name)
	}
	start := i + len(prefix)
	end := start + bytes.IndexByte(msg[start:], '\n')
	blob, err := base64.StdEncoding.DecodeString(string(msg[start:end]))
	if err != nil || len(blob) != 4+8+64 {
		return nil, fmt.Errorf("line of %s is not keyid||timestamp||sig", name)
	}
	blob[4+7] ^= 0x01
	out := append(bytes.Clone(msg[:start]), base64.StdEncoding.EncodeToString(blob)...)
	return append(out, msg[end:]...), nil
}

// cosigLine returns the decoded key id and timestamp of name's line in the note.
func cosigLine(n *note.Note, name string) (uint32, uint64, error) {
	for _, sigs := range [][]note.Signature{n.Sigs, n.UnverifiedSigs} {
		for _, s := range sigs {
			if s.Name != name {
				continue
			}
			blob, err := base64.StdEncoding.DecodeString(s.Base64)
			if err != nil || len(blob) != 4+8+64 {
				return 0, 0, fmt.Errorf("line of %s is %d bytes, want 76", name, len(blob))
			}
			return binary.BigEndian.Uint32(blob), binary.BigEndian.Uint64(blob[4:]), nil
		}
	}
	return 0, 0, errors.New("no line of " + name)
}

func check(file string) {
	raw, err := os.ReadFile(file)
	if err != nil {
		report(file, "read", err)
		return
	}
	var v vector
	if err := json.Unmarshal(raw, &v); err != nil {
		report(file, "parse JSON", err)
		return
	}
	msg := []byte(v.Note)

	pubs := map[string][]byte{}
	var cosigners []string
	for name, b64 := range v.Signers {
		pub, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(pub) != ed25519.PublicKeySize {
			report(file, "public key of "+name, fmt.Errorf("not a base64 Ed25519 key"))
			return
		}
		pubs[name] = pub
		if name != ledgerName {
			cosigners = append(cosigners, name)
		}
	}
	sort.Strings(cosigners)
	if pubs[ledgerName] == nil {
		report(file, "signers", errors.New("no "+ledgerName+" key"))
		return
	}

	// (a) The ledger's signature, with golang.org/x/mod/sumdb/note. The verifier key
	// is built by x/mod (NewEd25519VerifierKey computes the key hash itself).
	ledgerKey, err := note.NewEd25519VerifierKey(ledgerName, ed25519.PublicKey(pubs[ledgerName]))
	if err == nil && ledgerKey != vkey(ledgerName, 0x01, pubs[ledgerName]) {
		err = fmt.Errorf("x/mod vkey %q differs from C2SP key hash %q", ledgerKey, vkey(ledgerName, 0x01, pubs[ledgerName]))
	}
	report(file, "x/mod NewEd25519VerifierKey agrees with C2SP key hash (type 0x01)", err)
	ledgerV, err := note.NewVerifier(ledgerKey)
	if err != nil {
		report(file, "x/mod NewVerifier", err)
		return
	}
	report(file, "ledger signature (x/mod/sumdb/note.Open, Ed25519 type 0x01)", signedBy(msg, ledgerV))

	// (b) Each cosignature, with transparency-dev/formats/note.NewVerifierForCosignatureV1.
	cosigVs := []note.Verifier{}
	for _, name := range cosigners {
		cv, err := tdnote.NewVerifierForCosignatureV1(vkey(name, 0x04, pubs[name]))
		if err != nil {
			report(file, "cosigner "+name+": NewVerifierForCosignatureV1", err)
			continue
		}
		cosigVs = append(cosigVs, cv)
		if cv.KeyHash() != keyID(name, 0x04, pubs[name]) {
			err = fmt.Errorf("library key hash %08x, C2SP %08x", cv.KeyHash(), keyID(name, 0x04, pubs[name]))
		}
		report(file, "cosigner "+name+": transparency-dev key hash = SHA-256(name||LF||0x04||pk)[:4]", err)
		report(file, "cosigner "+name+": cosignature/v1 (transparency-dev/formats/note)", signedBy(msg, cv))

		n, err := note.Open(msg, note.VerifierList(cv))
		if err != nil {
			report(file, "cosigner "+name+": line key id and timestamp", err)
			continue
		}
		id, ts, err := cosigLine(n, name)
		if err == nil && id != keyID(name, 0x04, pubs[name]) {
			err = fmt.Errorf("line key id %08x, want %08x", id, keyID(name, 0x04, pubs[name]))
		}
		if err == nil && ts != v.CosignedAtS {
			err = fmt.Errorf("timestamp %d, want cosigned_at_s %d", ts, v.CosignedAtS)
		}
		if err == nil {
			for _, s := range n.Sigs {
				if s.Name == name {
					t, terr := tdnote.CoSigV1Timestamp(s)
					if terr != nil || uint64(t.Unix()) != ts {
						err = fmt.Errorf("CoSigV1Timestamp %v (%v), want %d", t, terr, ts)
					}
				}
			}
		}
		report(file, fmt.Sprintf("cosigner %s: line key id and big-endian timestamp = %d", name, v.CosignedAtS), err)

		// The ledger's 0x01 verifier must not accept the cosigner's 0x04 line and vice versa.
		plain, _ := note.NewVerifier(vkey(name, 0x01, pubs[name]))
		report(file, "cosigner "+name+": line is not a type-0x01 note signature", mustFail(signedBy(msg, plain)))
	}

	// (c) The body, with transparency-dev/formats/log.
	root, err := base64.StdEncoding.DecodeString(v.RootB64)
	if err != nil {
		report(file, "root_b64", err)
		return
	}
	n, err := note.Open(msg, note.VerifierList(ledgerV))
	if err != nil {
		report(file, "checkpoint body (log.Checkpoint.Unmarshal)", err)
	} else {
		var cp tlog.Checkpoint
		rest, err := cp.Unmarshal([]byte(n.Text))
		switch {
		case err != nil:
		case cp.Origin != v.Origin || cp.Size != v.Size || !bytes.Equal(cp.Hash, root):
			err = fmt.Errorf("got %q/%d/%x, want %q/%d/%x", cp.Origin, cp.Size, cp.Hash, v.Origin, v.Size, root)
		case len(rest) != 0:
			err = fmt.Errorf("unexpected extension lines %q", rest)
		case string(cp.Marshal()) != n.Text:
			err = errors.New("body is not in the canonical form log.Checkpoint.Marshal writes")
		}
		report(file, fmt.Sprintf("checkpoint body (log.Checkpoint.Unmarshal): %s / %d / %s, no extension lines", v.Origin, v.Size, v.RootB64), err)
	}
	_, _, pn, err := tlog.ParseCheckpoint(msg, v.Origin, ledgerV, cosigVs...)
	if err == nil && len(pn.Sigs) != 1+len(cosigVs) {
		err = fmt.Errorf("%d verified signatures, want %d", len(pn.Sigs), 1+len(cosigVs))
	}
	report(file, fmt.Sprintf("log.ParseCheckpoint: ledger + %d cosignature(s) verified together", len(cosigVs)), err)

	// Negative checks.
	bad := flipBodyByte(msg)
	report(file, "negative: flipped body byte fails the ledger signature", mustFail(signedBy(bad, ledgerV)))
	for i, cv := range cosigVs {
		name := cosigners[i]
		report(file, "negative: flipped body byte fails cosigner "+name, mustFail(signedBy(bad, cv)))
		badTS, err := flipTimestamp(msg, name)
		if err == nil {
			err = mustFail(signedBy(badTS, cv))
		}
		report(file, "negative: flipped timestamp byte fails cosigner "+name, err)
	}
	_, _, _, err = tlog.ParseCheckpoint(bad, v.Origin, ledgerV, cosigVs...)
	report(file, "negative: flipped body byte fails log.ParseCheckpoint", mustFail(err))
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go run . FILE.json [FILE.json ...]")
		os.Exit(2)
	}
	for _, f := range os.Args[1:] {
		check(f)
	}
	if failures > 0 {
		fmt.Printf("%d check(s) FAILED\n", failures)
		os.Exit(1)
	}
	fmt.Println("all checks passed")
}
