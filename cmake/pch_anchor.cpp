// Anchor translation unit for the shared precompiled header (cmake/Pch.cmake).
