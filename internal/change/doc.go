// Package change holds the data the pipeline's stages hand each other:
// a source position, a row operation and a transaction's operations for
// one bucket (from the sink through the core to the replayers), and a
// source's resume checkpoint (from the core into the checkpoint file).
// It is plain data and imports nothing of Retina's, so the core (mirror)
// and the checkpoint format stand on nothing heavy, and a process
// boundary between the stages needs only these types.
package change
