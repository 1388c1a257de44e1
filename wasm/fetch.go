//go:build js && wasm

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall/js"
	"testing/fstest"

	"webdraft/checkpoint"
	"webdraft/safetensors"
)

// fetchFolder fetches the files of the model folder at base (a URL,
// absolute or relative to the page) that checkpoint.LoadFS reads:
// config.json, and model.safetensors or model.safetensors.index.json with
// the shards it names (fetched at once). tokenizer.json is not fetched: the
// drafter takes token ids.
// fetchModel fetches the model folder at base (fetchFolder) into dir of an
// in-memory file system and, when the model uses another folder's
// embedding (checkpoint.SharedEmbeddingDir), that folder too, at the same
// relative path as beside it on the server.
func fetchModel(base string) (fsys fstest.MapFS, dir string, err error) {
	if !strings.HasSuffix(base, "/") {
		base += "/"
	}
	own, err := fetchFolder(base)
	if err != nil {
		return nil, "", err
	}
	dir = "model"
	fsys = fstest.MapFS{}
	for name, f := range own {
		fsys[path.Join(dir, name)] = f
	}
	st, ok := own[safetensors.SingleFile]
	if !ok {
		return fsys, dir, nil
	}
	f, err := safetensors.Parse(base+safetensors.SingleFile, st.Data)
	if err != nil {
		return nil, "", err
	}
	rel := checkpoint.SharedEmbeddingDir(f.Metadata)
	if rel == "" {
		return fsys, dir, nil
	}
	// The folder whose embedding the model uses, beside it as on disk.
	sib := path.Join(dir, rel)
	if !fs.ValidPath(sib) || sib == dir {
		return nil, "", fmt.Errorf("the shared embedding's folder %q is not beside the model's", rel)
	}
	shared, err := fetchFolder(base + rel + "/")
	if err != nil {
		return nil, "", fmt.Errorf("the shared embedding's folder %s: %w", rel, err)
	}
	for name, f := range shared {
		fsys[path.Join(sib, name)] = f
	}
	return fsys, dir, nil
}

func fetchFolder(base string) (fstest.MapFS, error) {
	if !strings.HasSuffix(base, "/") {
		base += "/"
	}
	fsys := fstest.MapFS{}
	get := func(name string) error {
		data, _, err := fetch(base + url.PathEscape(name))
		if err == nil {
			fsys[name] = &fstest.MapFile{Data: data}
		}
		return err
	}
	if err := get("config.json"); err != nil {
		return nil, err
	}

	idx, status, err := fetch(base + safetensors.IndexFile)
	switch {
	case status == 404:
		return fsys, get(safetensors.SingleFile)
	case err != nil:
		return nil, err
	}
	fsys[safetensors.IndexFile] = &fstest.MapFile{Data: idx}
	shards, err := shardNames(idx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", safetensors.IndexFile, err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(shards))
	files := make([]*fstest.MapFile, len(shards))
	for i, name := range shards {
		wg.Go(func() {
			data, _, err := fetch(base + url.PathEscape(name))
			errs[i], files[i] = err, &fstest.MapFile{Data: data}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, name := range shards {
		fsys[name] = files[i]
	}
	return fsys, nil
}

// shardNames lists the distinct files of an index's weight_map. The index is
// checked again, with the same rules, by safetensors.OpenFolderFS; plain
// file names are required here too, so nothing outside the folder is asked
// for.
func shardNames(idx []byte) ([]string, error) {
	var v struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(idx, &v); err != nil {
		return nil, err
	}
	var names []string
	for _, shard := range v.WeightMap {
		if path.Base(shard) != shard || shard == "." || shard == ".." {
			return nil, fmt.Errorf("shard name %q is not a plain file name", shard)
		}
		names = append(names, shard)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// fetch GETs addr with the page's fetch and returns the body and the HTTP
// status (0 when no response came).
func fetch(addr string) (body []byte, status int, err error) {
	resp, err := await(js.Global().Call("fetch", addr))
	if err != nil {
		return nil, 0, fmt.Errorf("fetching %s: %w", addr, err)
	}
	status = resp.Get("status").Int()
	if !resp.Get("ok").Bool() {
		return nil, status, fmt.Errorf("fetching %s: HTTP %d %s", addr, status, resp.Get("statusText").String())
	}
	buf, err := await(resp.Call("arrayBuffer"))
	if err != nil {
		return nil, status, fmt.Errorf("reading %s: %w", addr, err)
	}
	arr := js.Global().Get("Uint8Array").New(buf)
	body = make([]byte, arr.Length())
	js.CopyBytesToGo(body, arr)
	return body, status, nil
}

// await waits for a Promise to settle. The goroutine blocks; the page's
// event loop runs meanwhile.
func await(p js.Value) (js.Value, error) {
	type result struct {
		v   js.Value
		err error
	}
	ch := make(chan result, 1)
	onResolve := js.FuncOf(func(_ js.Value, args []js.Value) any {
		ch <- result{v: arg(args, 0)}
		return nil
	})
	defer onResolve.Release()
	onReject := js.FuncOf(func(_ js.Value, args []js.Value) any {
		ch <- result{err: errors.New(js.Global().Call("String", arg(args, 0)).String())}
		return nil
	})
	defer onReject.Release()
	p.Call("then", onResolve, onReject)
	r := <-ch
	return r.v, r.err
}
