// LF_API marks what the shared runtime exports: the classes and functions of the public headers.
// The library is compiled with hidden visibility, so everything else (process spawning, error
// files, the checkpoint container, process groups) stays inside it and is no ABI to keep.
#pragma once

#define LF_API __attribute__((visibility("default")))
